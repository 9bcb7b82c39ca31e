#include "rtable/operator/clock.h"

namespace rtable::op {

SteadyClock& SteadyClock::instance() {
  static SteadyClock clock;
  return clock;
}

}  // namespace rtable::op
