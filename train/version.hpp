// version_text(): this build and the versions of every library built in, for
// `ringtrain --version` and the start record of a run's metrics and TensorBoard files.
#pragma once

#include <string>

namespace ringtrain::launch {

std::string version_text();  // ringtrain and every library built in

}  // namespace ringtrain::launch
