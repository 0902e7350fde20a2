// AR-Topk's index rank: the fast exact top-k index selection (sampled low threshold, one
// collecting pass, nth_element on the short list) against the sort-based reference.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "gravac/compress/index_selection.hpp"
#include "gravac_test_util.hpp"
#include "topk_reference.hpp"

using namespace gravac;

TEST_CASE("the fast top-k index selection equals the reference, ties included", "[index_selection]") {
  std::vector<std::uint64_t> fast, want, scratch, order;
  for (std::size_t n : {std::size_t{65537}, std::size_t{100003}, (std::size_t{1} << 18) + 5, std::size_t{1} << 20}) {
    for (int kind = 0; kind < 5; ++kind) {
      const auto u = test::data_of_kind(kind, n, 17 + n + kind);
      for (double f : {0.0001, 0.001, 0.01, 0.1, 0.24, 0.5}) {
        const std::size_t k = kept_count(n, f);
        detail::select_topk_indices(u, k, scratch, fast);
        test::select_topk_reference(u, k, order, want);
        INFO("n " << n << " data " << kind << " f " << f);
        REQUIRE(fast.size() == k);
        CHECK(fast == want);
      }
    }
  }
}

TEST_CASE("the fast top-k index selection falls back to the reference on non-finite input", "[index_selection]") {
  const std::size_t n = 200000;
  auto u = test::make_data(n, 5, test::distribution::gaussian);
  u[77] = std::numeric_limits<float>::infinity();
  u[1234] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::uint64_t> fast, want, scratch, order;
  for (std::size_t k : {std::size_t{1}, std::size_t{200}, std::size_t{2000}}) {
    detail::select_topk_indices(u, k, scratch, fast);
    test::select_topk_reference(u, k, order, want);
    CHECK(fast == want);
  }
}

TEST_CASE("AR-Topk's topk and threshold hooks select the reference's indices", "[index_selection][ar_topk]") {
  const auto lay = layout::flat(300000);
  const auto u = test::make_data(lay.numel(), 9, test::distribution::laplace);
  auto p = test::params_for(lay, 0.01);
  std::vector<std::uint64_t> got, want, scratch, order;
  test::select_topk_reference(u, kept_count(u.size(), 0.01), order, want);
  index_selection<topk>::select(topk(lay), u, 0, p, got, scratch);
  CHECK(got == want);
  index_selection<threshold>::select(threshold(lay), u, 0, p, got, scratch);
  CHECK(got == want);
}
