// Which compositions are valid: the traits of composition.hpp against what the trainer
// accepts, and the composition table of docs/compositions.md, generated here from the same traits so that
// it cannot drift from the code (GRAVAC_UPDATE_DOCS=1 rewrites it). No opt-in
// (allow_ignored_decisions) may be visible in this file: the table is the library's own;
// test_composition_opt_in shows the opt-in.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gravac/compress/powersgd.hpp"
#include "gravac/gravac.hpp"
#include "gravac_test_util.hpp"

using namespace gravac;

namespace {

template <class... T>
struct type_list {};

template <class T>
constexpr const char* name_of();
#define GRAVAC_TEST_NAME(T)            \
  template <>                          \
  constexpr const char* name_of<T>() { \
    return #T;                         \
  }
GRAVAC_TEST_NAME(identity)
GRAVAC_TEST_NAME(topk)
GRAVAC_TEST_NAME(threshold)
GRAVAC_TEST_NAME(randomk)
GRAVAC_TEST_NAME(adacomp)
GRAVAC_TEST_NAME(qsgd)
GRAVAC_TEST_NAME(terngrad)
GRAVAC_TEST_NAME(sign)
GRAVAC_TEST_NAME(cast16)
GRAVAC_TEST_NAME(powersgd)
GRAVAC_TEST_NAME(mxfp8)
GRAVAC_TEST_NAME(mxfp4)
GRAVAC_TEST_NAME(nvfp4)
GRAVAC_TEST_NAME(fp8_rowwise)
GRAVAC_TEST_NAME(sparseloco)
GRAVAC_TEST_NAME(dense_allreduce)
GRAVAC_TEST_NAME(allgather)
GRAVAC_TEST_NAME(allreduce_compatible)
GRAVAC_TEST_NAME(flexible)
GRAVAC_TEST_NAME(low_rank_allreduce)
GRAVAC_TEST_NAME(compressed_allreduce)
GRAVAC_TEST_NAME(fixed_policy)
GRAVAC_TEST_NAME(gravac_policy)
GRAVAC_TEST_NAME(accordion_policy)
GRAVAC_TEST_NAME(adacomp_policy)
GRAVAC_TEST_NAME(moo_policy)
#undef GRAVAC_TEST_NAME

using compressors = type_list<identity, topk, threshold, randomk, adacomp, qsgd, terngrad, sign, cast16, powersgd,
                              mxfp8, mxfp4, nvfp4, fp8_rowwise, sparseloco>;
using collectives =
    type_list<dense_allreduce, allgather, allreduce_compatible, flexible, low_rank_allreduce, compressed_allreduce>;
using policies = type_list<fixed_policy, gravac_policy, accordion_policy, adacomp_policy, moo_policy>;

template <class C, class K, class... P>
void row(std::ostringstream& os, type_list<P...>) {
  os << "| `" << name_of<C>() << "` | `" << name_of<K>() << "` |";
  ((os << ' '
       << (detail::composition_verdict<C, K, P>() == rejection::none
               ? std::string("valid")
               : std::string("no: ") + to_string(detail::composition_verdict<C, K, P>()))
       << " |"),
   ...);
  os << '\n';
}

template <class... C, class... K>
void rows(std::ostringstream& os, type_list<C...>, type_list<K...>) {
  ([&]<class One>() { (row<One, K>(os, policies{}), ...); }.template operator()<C>(), ...);
}

template <class... P>
void header(std::ostringstream& os, type_list<P...>) {
  os << "| compressor | collective |";
  ((os << " `" << name_of<P>() << "` |"), ...);
  os << "\n|---|---|";
  ((os << "---|", (void)sizeof(P)), ...);
  os << '\n';
}

std::string generated_table() {
  std::ostringstream os;
  os << "# Compositions\n\n"
        "Every composition of the library's host compressors, collectives and policies, and why the\n"
        "trainer refuses the others at compile time (the first error line says the same). Generated\n"
        "from the traits of `gravac/composition.hpp` and the collectives' `accepts` by\n"
        "`tests/unit/test_composition.cpp`, which fails when this page differs from the code; rerun it\n"
        "with `GRAVAC_UPDATE_DOCS=1` to rewrite the page.\n\n"
        "A policy's decisions must reach the compressor: GraVAC and the multi-objective policy decide\n"
        "kept fractions, Accordion kept fractions or PowerSGD's rank, AdaComp's policy bin lengths (and\n"
        "1 / L_T as a kept fraction); `fixed_policy` sets a fixed configuration and fits every\n"
        "compressor. Quantizers, sign, cast16 and identity read no decision (a kept fraction of 1 only\n"
        "sends a layer raw). To compose one anyway, opt in:\n"
        "`template <> inline constexpr bool gravac::allow_ignored_decisions<C, P> = true;`.\n\n"
        "Device memory: the device compressors (`topk_cuda`, `threshold_cuda`, `adacomp_cuda`,\n"
        "`qsgd_cuda`, `terngrad_cuda`, `sign_cuda`, `cast16_cuda`, `mxfp8_cuda`, `mxfp4_cuda`,\n"
        "`nvfp4_cuda`) act on what their host\n"
        "counterparts act on and compose like them with `dense_allreduce` and `allgather` over a\n"
        "device communicator (`nccl_communicator`); `topk_cuda` and `threshold_cuda` also compose with\n"
        "`allreduce_compatible`, through the device form of the index-selection hook (the indices are\n"
        "chosen, broadcast and validated on the device; compiled, not run: no GPU was available when\n"
        "it was written). A device compressor with only the host form of the hook is refused (no\n"
        "device-memory index-selection hook).\n\n";
  header(os, policies{});
  rows(os, compressors{}, collectives{});
  return os.str();
}

}  // namespace

TEST_CASE("composition traits: what each policy decides reaches the compressors that act on it", "[composition]") {
  STATIC_REQUIRE(decisions_reach_v<topk, gravac_policy>);
  STATIC_REQUIRE(decisions_reach_v<powersgd, accordion_policy>);
  STATIC_REQUIRE(decisions_reach_v<adacomp, adacomp_policy>);
  STATIC_REQUIRE(decisions_reach_v<topk, adacomp_policy>);
  STATIC_REQUIRE_FALSE(decisions_reach_v<adacomp, accordion_policy>);
  STATIC_REQUIRE_FALSE(decisions_reach_v<adacomp, gravac_policy>);
  STATIC_REQUIRE_FALSE(decisions_reach_v<adacomp, moo_policy>);
  STATIC_REQUIRE_FALSE(decisions_reach_v<powersgd, gravac_policy>);
  STATIC_REQUIRE_FALSE(decisions_reach_v<identity, accordion_policy>);
  STATIC_REQUIRE(decisions_reach_v<qsgd, fixed_policy>);
  STATIC_REQUIRE_FALSE(decisions_reach_v<qsgd, gravac_policy>);  // no opt-in in this file
  STATIC_REQUIRE_FALSE(decisions_reach_v<terngrad, gravac_policy>);
  STATIC_REQUIRE(detail::composition_verdict<qsgd, allreduce_compatible, fixed_policy>() == rejection::not_summable);
  STATIC_REQUIRE(detail::composition_verdict<powersgd, allgather, fixed_policy>() ==
                 rejection::low_rank_needs_allreduces);
  STATIC_REQUIRE(detail::composition_verdict<topk, low_rank_allreduce, fixed_policy>() == rejection::not_low_rank);
  STATIC_REQUIRE(detail::composition_verdict<topk, allreduce_compatible, moo_policy>() == rejection::none);
  CHECK(to_string(decides_v<accordion_policy>) == "kept fraction and rank");
  CHECK(to_string(acts_on_v<qsgd>) == "nothing");
}

TEST_CASE("docs/compositions.md is the table the traits give", "[composition][docs]") {
  const std::string path = std::string(GRAVAC_SOURCE_DIR) + "/docs/compositions.md";
  const std::string want = generated_table();
  if (const char* u = std::getenv("GRAVAC_UPDATE_DOCS"); u != nullptr && std::string(u) == "1") {
    std::ofstream(path, std::ios::binary) << want;
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream have;
  have << in.rdbuf();
  INFO("docs/compositions.md differs from the traits; rerun with GRAVAC_UPDATE_DOCS=1 to rewrite it");
  CHECK(have.str() == want);
}
