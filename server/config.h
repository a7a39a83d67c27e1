// The server's configuration: the protobuf text-format ServerConfig (--config) and the
// command-line flags that override it.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kiln/v1/kiln.pb.h"
#include "server/server.h"

namespace kiln {

// Parses a text-format ServerConfig; errors give the file, line and column.
absl::StatusOr<v1::ServerConfig> ParseServerConfig(absl::string_view text,
                                                   absl::string_view file_name = "config");
absl::StatusOr<v1::ServerConfig> ReadServerConfig(const std::string& path);

// Sets every option the config gives (fields left at 0 / empty keep the option's value). A
// config file's relative paths (model roots, token and TLS files) are relative to `base_dir`
// when it is not empty.
absl::Status ApplyServerConfig(const v1::ServerConfig& config, const std::string& base_dir,
                               ServerOptions* options);

// "NAME=PATH" (a --model flag).
absl::StatusOr<ModelSpec> ParseModelFlag(absl::string_view text);

// Every value of a repeatable flag `--name` in argv, in order: "--name=V", "--name V", "-name=V"
// and "-name V", each split at commas (empty pieces dropped when split_commas). Stops at "--".
// absl flags keep only the last occurrence of a flag, hence this pass.
std::vector<std::string> CollectRepeatedFlag(int argc, char** argv, absl::string_view name,
                                             bool split_commas);

// Adds `spec` to `models`, replacing a model of the same name.
void AddOrReplaceModel(ModelSpec spec, std::vector<ModelSpec>* models);

// A --chat-template value: "NAME=FILE" for the startup model NAME, else FILE for every startup
// model. InvalidArgument when there is no model to apply it to.
absl::Status ApplyChatTemplateFlag(absl::string_view text, std::vector<ModelSpec>* models);
// A --quantize value: "NAME=MODE" or MODE (none, int8, int4), as --chat-template.
absl::Status ApplyQuantizeFlag(absl::string_view text, std::vector<ModelSpec>* models);

}  // namespace kiln
