#include "clients/loadgen/sse.h"

#include <utility>

namespace kiln::loadgen {

void SseParser::Feed(std::string_view bytes, std::vector<SseEvent>* out) {
  if (at_start_ && !bytes.empty()) {
    // The UTF-8 byte-order mark may itself arrive split; wait for three bytes before deciding.
    static constexpr std::string_view kBom = "\xEF\xBB\xBF";
    line_.append(bytes);
    if (line_.size() < kBom.size() && kBom.substr(0, line_.size()) == line_) return;
    at_start_ = false;
    std::string head = std::move(line_);
    line_.clear();
    std::string_view rest(head);
    if (rest.substr(0, kBom.size()) == kBom) rest.remove_prefix(kBom.size());
    Feed(rest, out);
    return;
  }
  size_t begin = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (c != '\r' && c != '\n') continue;
    if (c == '\n' && after_cr_ && i == begin && line_.empty()) {
      // The LF of a CRLF whose CR ended the previous read (or line).
      after_cr_ = false;
      begin = i + 1;
      continue;
    }
    if (line_.empty()) {
      Line(bytes.substr(begin, i - begin), out);
    } else {
      line_.append(bytes.substr(begin, i - begin));
      Line(line_, out);
      line_.clear();
    }
    after_cr_ = c == '\r';
    begin = i + 1;
  }
  if (begin < bytes.size()) {
    line_.append(bytes.substr(begin));
    after_cr_ = false;
  }
}

void SseParser::Finish(std::vector<SseEvent>* out) {
  line_.clear();  // a line without its end may be cut short: dropped
  at_start_ = false;
  if (has_data_) Dispatch(out);
  has_fields_ = has_data_ = false;
  event_ = SseEvent();
}

void SseParser::Line(std::string_view line, std::vector<SseEvent>* out) {
  if (line.empty()) {
    if (has_data_) Dispatch(out);
    has_fields_ = has_data_ = false;
    event_ = SseEvent();
    return;
  }
  if (line.front() == ':') return;  // a comment
  std::string_view field = line, value;
  if (const size_t colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  has_fields_ = true;
  if (field == "data") {
    if (has_data_) event_.data.push_back('\n');
    event_.data.append(value);
    has_data_ = true;
  } else if (field == "event") {
    event_.event = std::string(value);
  } else if (field == "id") {
    if (value.find('\0') == std::string_view::npos) event_.id = std::string(value);
  }
  // "retry" and unknown fields are ignored, as the format says.
}

void SseParser::Dispatch(std::vector<SseEvent>* out) {
  out->push_back(std::move(event_));
  event_ = SseEvent();
}

}  // namespace kiln::loadgen
