// rtable-operator: flags, the health/metrics servers, leader election and graceful shutdown
// (operator_main.h). No reconcilers yet: the controllers/ main passes them in.
#include "rtable/operator/operator_main.h"

int main(int argc, char** argv) {
  return rtable::op::runOperatorMain(argc, argv);
}
