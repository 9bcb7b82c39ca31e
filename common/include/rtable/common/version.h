// rtable's version (the CMake project's), as the binaries' --version prints it.
#pragma once

#include <string_view>

namespace rtable::common {

// "0.1.0"
std::string_view version();

}  // namespace rtable::common
