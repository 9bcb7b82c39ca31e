#include "rtable/common/clock.h"

namespace rtable::common {

SteadyClock& SteadyClock::instance() {
  static SteadyClock clock;
  return clock;
}

}  // namespace rtable::common
