// `kiln generate`, `kiln tokenize` and `kiln health`, and the connection helpers of cli_grpc.h.
#include "clients/cli_grpc.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "clients/cli.h"
#include "clients/cli_flags.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kiln/v1/kiln.grpc.pb.h"

namespace kiln::cli {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, ": cannot read \"", path, "\""));
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string Quoted(absl::string_view text) {
  return absl::StrCat("\"", absl::CHexEscape(text), "\"");
}

// The fields of a GenerateRequest that come from flags; `command` names errors.
absl::StatusOr<kiln::v1::GenerateRequest> BuildGenerateRequest() {
  kiln::v1::GenerateRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  if (request.model().empty()) return absl::InvalidArgumentError("generate needs --model NAME");
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  const std::string prompt_ids = absl::GetFlag(FLAGS_prompt_ids);
  if (prompt.empty() == prompt_ids.empty()) {
    return absl::InvalidArgumentError("generate needs one of --prompt TEXT and --prompt_ids 1,2,3");
  }
  if (!prompt.empty()) {
    request.set_prompt(prompt);
  } else {
    absl::StatusOr<std::vector<int32_t>> ids = ParseIds(prompt_ids, "prompt_ids");
    if (!ids.ok()) return ids.status();
    request.mutable_prompt_token_ids()->mutable_ids()->Add(ids->begin(), ids->end());
  }
  kiln::v1::SamplingParams& sampling = *request.mutable_sampling();
  sampling.set_temperature(absl::GetFlag(FLAGS_temperature));
  sampling.set_top_k(absl::GetFlag(FLAGS_top_k));
  if (auto top_p = absl::GetFlag(FLAGS_top_p)) sampling.set_top_p(*top_p);
  sampling.set_min_p(absl::GetFlag(FLAGS_min_p));
  if (auto penalty = absl::GetFlag(FLAGS_repetition_penalty)) {
    sampling.set_repetition_penalty(*penalty);
  }
  sampling.set_presence_penalty(absl::GetFlag(FLAGS_presence_penalty));
  sampling.set_frequency_penalty(absl::GetFlag(FLAGS_frequency_penalty));
  if (auto seed = absl::GetFlag(FLAGS_seed)) sampling.set_seed(*seed);

  kiln::v1::StoppingCriteria& stopping = *request.mutable_stopping();
  stopping.set_max_tokens(absl::GetFlag(FLAGS_max_tokens).value_or(0));
  for (const std::string& stop : RepeatedValues("stop")) stopping.add_stop(stop);
  absl::StatusOr<std::vector<int32_t>> stop_ids =
      ParseIds(absl::GetFlag(FLAGS_stop_token_ids), "stop_token_ids");
  if (!stop_ids.ok()) return stop_ids.status();
  stopping.mutable_stop_token_ids()->Add(stop_ids->begin(), stop_ids->end());
  stopping.set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));

  request.set_logprobs(absl::GetFlag(FLAGS_logprobs));
  request.set_add_special_tokens(absl::GetFlag(FLAGS_add_special_tokens));
  if (absl::GetFlag(FLAGS_draft_tokens).has_value()) {
    request.mutable_speculative()->set_num_draft_tokens(*absl::GetFlag(FLAGS_draft_tokens));
  }
  return request;
}

void PrintLogprobs(const std::vector<kiln::v1::TokenLogprobs>& logprobs) {
  std::cerr << "logprobs:\n";
  for (size_t i = 0; i < logprobs.size(); ++i) {
    const kiln::v1::TokenLogprob& chosen = logprobs[i].chosen();
    std::cerr << absl::StrFormat("  [%d] %d %s %.4f", i, chosen.token_id(), Quoted(chosen.text()),
                                 chosen.logprob());
    std::vector<std::string> top;
    for (const kiln::v1::TokenLogprob& entry : logprobs[i].top()) {
      top.push_back(
          absl::StrFormat("%d %s %.4f", entry.token_id(), Quoted(entry.text()), entry.logprob()));
    }
    if (!top.empty()) std::cerr << "  top: " << absl::StrJoin(top, ", ");
    std::cerr << "\n";
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel() {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  const std::string ca_file = absl::GetFlag(FLAGS_tls_ca);
  if (!ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(ca_file, "tls-ca");
    if (!ca.ok()) return ca.status();
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = *ca;
    credentials = grpc::SslCredentials(options);
  } else if (absl::GetFlag(FLAGS_tls)) {
    credentials = grpc::SslCredentials(grpc::SslCredentialsOptions());
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  const std::string server = absl::GetFlag(FLAGS_server);
  if (server.empty()) return absl::InvalidArgumentError("--server is empty");
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(256 << 20);
  return grpc::CreateCustomChannel(server, credentials, arguments);
}

void SetDeadline(grpc::ClientContext* context) {
  const double timeout = absl::GetFlag(FLAGS_timeout);
  if (timeout > 0) {
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::duration_cast<std::chrono::system_clock::duration>(
                              std::chrono::duration<double>(timeout)));
  }
}

absl::Status AddAdminToken(grpc::ClientContext* context) {
  std::string token = absl::GetFlag(FLAGS_admin_token);
  const std::string file = absl::GetFlag(FLAGS_admin_token_file);
  if (!token.empty() && !file.empty()) {
    return absl::InvalidArgumentError("give --admin-token or --admin-token-file, not both");
  }
  if (!file.empty()) {
    absl::StatusOr<std::string> contents = ReadFile(file, "admin-token-file");
    if (!contents.ok()) return contents.status();
    token = std::string(absl::StripAsciiWhitespace(*contents));
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--admin-token-file: \"", file, "\" is empty"));
    }
  }
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
  return absl::OkStatus();
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  if (auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
      !status.ok()) {
    return absl::InternalError(absl::StrCat("cannot print JSON: ", status.ToString()));
  }
  return json;
}

int Generate(const Args& args) {
  if (absl::Status status = ExpectArgs(args, 0, "flags only"); !status.ok()) {
    return UsageError("generate", status.message());
  }
  absl::StatusOr<kiln::v1::GenerateRequest> request = BuildGenerateRequest();
  if (!request.ok()) return UsageError("generate", request.status().message());
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = OpenChannel();
  if (!channel.ok()) return ReportError(channel.status());
  std::unique_ptr<kiln::v1::Inference::Stub> stub = kiln::v1::Inference::NewStub(*channel);

  grpc::ClientContext context;
  SetDeadline(&context);
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<grpc::ClientReader<kiln::v1::GenerateResponse>> reader =
      stub->Generate(&context, *request);
  kiln::v1::GenerateResponse response;
  kiln::v1::GenerateResponse last;  // the one with the finish reason
  std::vector<int32_t> ids;
  std::vector<kiln::v1::TokenLogprobs> logprobs;
  double first_token_seconds = -1;
  char last_char = '\n';
  while (reader->Read(&response)) {
    if (first_token_seconds < 0 && response.token_ids_size() > 0)
      first_token_seconds = Since(start);
    if (!response.text().empty()) {
      std::fwrite(response.text().data(), 1, response.text().size(), stdout);
      std::fflush(stdout);
      last_char = response.text().back();
    }
    ids.insert(ids.end(), response.token_ids().begin(), response.token_ids().end());
    logprobs.insert(logprobs.end(), response.logprobs().begin(), response.logprobs().end());
    if (response.finish_reason() != kiln::v1::FINISH_REASON_UNSPECIFIED || response.has_usage()) {
      last = response;
    }
  }
  const grpc::Status status = reader->Finish();
  const double client_seconds = Since(start);
  if (last_char != '\n' && isatty(STDOUT_FILENO)) std::fputc('\n', stdout);
  if (absl::GetFlag(FLAGS_ids) && (status.ok() || !ids.empty())) {
    if (last_char != '\n' && !isatty(STDOUT_FILENO)) std::fputc('\n', stdout);
    std::fprintf(stdout, "ids: %s\n", absl::StrJoin(ids, ",").c_str());
  }
  std::fflush(stdout);
  if (!status.ok()) return ReportError(FromGrpc(status));

  if (!logprobs.empty()) PrintLogprobs(logprobs);
  const int completion =
      last.has_usage() ? last.usage().completion_tokens() : static_cast<int>(ids.size());
  double ttft = first_token_seconds < 0 ? 0 : first_token_seconds;
  double total = client_seconds;
  if (last.has_timings() && last.timings().total_seconds() > 0) {
    ttft = last.timings().time_to_first_token_seconds();
    total = last.timings().total_seconds();
  }
  const double tokens_per_second = completion > 1 && total > ttft
                                       ? (completion - 1) / (total - ttft)
                                   : total > 0 ? completion / total
                                               : 0;
  std::string summary = absl::StrFormat(
      "finish_reason=%s prompt_tokens=%d completion_tokens=%d ttft_ms=%.1f "
      "decode_tokens_per_s=%.1f total_s=%.3f",
      kiln::v1::FinishReason_Name(last.finish_reason()), last.usage().prompt_tokens(), completion,
      ttft * 1e3, tokens_per_second, total);
  if (last.speculative_stats().drafted() > 0) {
    absl::StrAppendFormat(&summary, " drafted=%d accepted=%d", last.speculative_stats().drafted(),
                          last.speculative_stats().accepted());
  }
  std::cerr << summary << "\n";
  return kExitOk;
}

int Tokenize(const Args& args) {
  if (absl::Status status = ExpectArgs(args, 0, "flags only"); !status.ok()) {
    return UsageError("tokenize", status.message());
  }
  kiln::v1::TokenizeRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_text(absl::GetFlag(FLAGS_text));
  request.set_add_special_tokens(absl::GetFlag(FLAGS_add_special_tokens));
  if (request.model().empty()) return UsageError("tokenize", "tokenize needs --model NAME");
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = OpenChannel();
  if (!channel.ok()) return ReportError(channel.status());
  grpc::ClientContext context;
  SetDeadline(&context);
  kiln::v1::TokenizeResponse response;
  const grpc::Status status =
      kiln::v1::Inference::NewStub(*channel)->Tokenize(&context, request, &response);
  if (!status.ok()) return ReportError(FromGrpc(status));
  if (absl::GetFlag(FLAGS_json)) {
    absl::StatusOr<std::string> json = ToJson(response);
    if (!json.ok()) return ReportError(json.status());
    std::cout << *json << "\n";
    return kExitOk;
  }
  std::vector<std::string> tokens;
  for (const std::string& token : response.tokens()) tokens.push_back(Quoted(token));
  std::cout << response.token_ids_size() << " tokens\n"
            << "ids: " << absl::StrJoin(response.token_ids(), ",") << "\n"
            << "tokens: " << absl::StrJoin(tokens, " ") << "\n";
  return kExitOk;
}

int Health(const Args& args) {
  if (absl::Status status = ExpectArgs(args, 0, "flags only"); !status.ok()) {
    return UsageError("health", status.message());
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = OpenChannel();
  if (!channel.ok()) return ReportError(channel.status());
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(absl::GetFlag(FLAGS_service));
  grpc::ClientContext context;
  SetDeadline(&context);
  if (absl::GetFlag(FLAGS_wait)) {
    context.set_wait_for_ready(true);
    if (absl::GetFlag(FLAGS_timeout) <= 0) {
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    }
  }
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status =
      grpc::health::v1::Health::NewStub(*channel)->Check(&context, request, &response);
  if (!status.ok()) return ReportError(FromGrpc(status));
  std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status()) << "\n";
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? kExitOk
                                                                             : kExitNotServing;
}

}  // namespace kiln::cli
