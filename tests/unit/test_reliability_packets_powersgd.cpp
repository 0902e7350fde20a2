// The low-rank (PowerSGD) decoder against the malformed-packet battery (packet_battery.hpp).
// Built only when gravac::powersgd (Eigen) exists: tests named *powersgd* link it.
#include "gravac/compress/powersgd.hpp"
#include "packet_battery.hpp"

using namespace gravac;

TEST_CASE("packets: low-rank (PowerSGD) survives the battery", "[reliability][packet]") {
  test::packet_battery<powersgd>({}, -1);
  test::packet_battery<powersgd>({.rank = 1, .warm_start = false}, -1);
}
