// A parser of server-sent events (the WHATWG text/event-stream format), fed the bytes of a
// response body as they arrive: an event may be split across reads, lines end in CRLF, LF or CR,
// lines starting with ':' are comments (keep-alives), and several data lines join with '\n'.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln::loadgen {

struct SseEvent {
  std::string event;  // the "event:" field; "" means "message"
  std::string data;   // the "data:" lines, joined with '\n'
  std::string id;     // the "id:" field
};

class SseParser {
 public:
  // Appends to `out` every event that `bytes` completes (an event ends at a blank line).
  void Feed(std::string_view bytes, std::vector<SseEvent>* out);
  // At the end of the body: an event whose lines all ended but that lacks the closing blank line
  // is dispatched too (some servers close right after their last "data: [DONE]\n"); a line cut
  // short is dropped, as the format says.
  void Finish(std::vector<SseEvent>* out);
  // Whether bytes of an incomplete line or event are pending.
  bool pending() const { return !line_.empty() || has_fields_; }

 private:
  void Line(std::string_view line, std::vector<SseEvent>* out);
  void Dispatch(std::vector<SseEvent>* out);

  std::string line_;         // the current line so far
  bool after_cr_ = false;    // the last byte was a CR: a following LF ends no second line
  bool at_start_ = true;     // a byte-order mark at the very start is skipped
  bool has_fields_ = false;  // the current event has a field
  bool has_data_ = false;    // ... a data field (else it dispatches nothing)
  SseEvent event_;
};

}  // namespace kiln::loadgen
