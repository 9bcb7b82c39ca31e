#include "rtable/common/version.h"

namespace rtable::common {

std::string_view version() {
  return RTABLE_VERSION;
}

}  // namespace rtable::common
