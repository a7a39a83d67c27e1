// Logging for kiln: glog's LOG(INFO|WARNING|ERROR) and VLOG(n). (abseil 20220623, the version
// Debian bookworm ships, predates absl/log.)
#pragma once

#include <glog/logging.h>
