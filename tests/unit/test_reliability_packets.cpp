// Every packet kind's decoder against the malformed-packet battery (packet_battery.hpp):
// truncation at every length, corrupted headers, counts beyond the buffer, indices out of
// range or repeated, random flips. PowerSGD (Eigen) has its own file,
// test_reliability_packets_powersgd.cpp.
#include "packet_battery.hpp"

using namespace gravac;

TEST_CASE("packets: dense (identity) survives the battery", "[reliability][packet]") {
  test::packet_battery<identity>({}, -1);
}
TEST_CASE("packets: sparse (top-k) survives the battery", "[reliability][packet]") {
  test::packet_battery<topk>({}, 0);
}
TEST_CASE("packets: sparse (whole-buffer top-k) survives the battery", "[reliability][packet]") {
  test::packet_battery<topk>({.whole_buffer = true}, 0);
}
TEST_CASE("packets: sparse (threshold) survives the battery", "[reliability][packet]") {
  test::packet_battery<threshold>({}, 0);
}
TEST_CASE("packets: seeded (random-k) survives the battery", "[reliability][packet]") {
  test::packet_battery<randomk>({}, -1);
}
TEST_CASE("packets: AdaComp survives the battery", "[reliability][packet]") { test::packet_battery<adacomp>({}, 8); }
TEST_CASE("packets: quantized (QSGD) survives the battery", "[reliability][packet]") {
  test::packet_battery<qsgd>({.levels = 7, .bucket = 64}, -1);
  test::packet_battery<qsgd>({.levels = 300, .bucket = 0}, -1);
}
TEST_CASE("packets: quantized (TernGrad) survives the battery", "[reliability][packet]") {
  test::packet_battery<terngrad>({.bucket = 64}, -1);
}
TEST_CASE("packets: quantized (sign) survives the battery", "[reliability][packet]") {
  test::packet_battery<sign>({}, -1);
}
TEST_CASE("packets: quantized (cast16, fp16 and bf16) survives the battery", "[reliability][packet]") {
  test::packet_battery<cast16>({.format = cast16_format::fp16}, -1);
  test::packet_battery<cast16>({.format = cast16_format::bf16}, -1);
}
