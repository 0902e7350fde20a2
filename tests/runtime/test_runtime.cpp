#include <catch2/catch.hpp>
#include <fstream>
#include <gravac/comm/thread_communicator.hpp>
#include <gravac/runtime/make_trainer.hpp>
#include <gravac/runtime/option_table.hpp>
#include <gravac/runtime/presets.hpp>
#include <gravac/trainer/detail/composition_checks.hpp>
#include <set>
#include <sstream>

#include "gravac_test_util.hpp"

using namespace gravac;
namespace rt = gravac::runtime;

namespace {

// A small layout with every layer kind and a matrix PowerSGD can factor.
layout small_layout() {
  layout lay;
  lay.add("conv.weight", {4, 2, 3, 3}, layer_kind::conv);
  lay.add("fc.weight", {16, 12}, layer_kind::dense);
  lay.add("fc.bias", {16}, layer_kind::bias_or_norm);
  return lay;
}

std::vector<float> gradient(std::size_t n, int rank, int step) {
  return test::make_data(n, 7919 * static_cast<std::uint64_t>(step) + static_cast<std::uint64_t>(rank) + 1,
                         rank % 2 ? test::distribution::laplace : test::distribution::gaussian);
}

}  // namespace

TEST_CASE("runtime: every option of the table reads back what it was set to, and rejects bad values",
          "[runtime][options]") {
  rt::method_config m;
  std::set<std::string_view> seen;
  for (const auto& o : rt::option_table()) {
    INFO(o.name);
    CHECK(seen.insert(o.name).second);  // names are unique
    CHECK(!o.doc.empty());
    const std::string def = o.get(m);
    rt::method_config copy = m;
    o.set(copy, def);  // the default, as text, is a valid value that reads back the same
    CHECK(o.get(copy) == def);
    switch (o.type) {
      case rt::option_type::boolean:
        o.set(copy, "true");
        CHECK(o.get(copy) == "true");
        CHECK_THROWS_AS(o.set(copy, "maybe"), gravac::error);
        break;
      case rt::option_type::integer:
        CHECK_THROWS_WITH(o.set(copy, "1.5"), Catch::Contains("not an integer"));
        CHECK_THROWS_WITH(o.set(copy, rt::detail::number_text(o.max * 2 + 1)), Catch::Contains("out of range"));
        o.set(copy, rt::detail::number_text(o.min));
        CHECK(std::stod(o.get(copy)) == o.min);
        break;
      case rt::option_type::real:
        CHECK_THROWS_WITH(o.set(copy, "x"), Catch::Contains("not a number"));
        CHECK_THROWS_WITH(o.set(copy, "nan"), Catch::Contains("not a number"));
        CHECK_THROWS_WITH(o.set(copy, rt::detail::number_text(o.min - 1)), Catch::Contains("out of range"));
        break;
      case rt::option_type::choice: {
        CHECK_THROWS_WITH(o.set(copy, "nonsense"), Catch::Contains("is not one of"));
        std::string_view rest = o.choices;
        while (!rest.empty()) {  // every choice is accepted and reads back
          const auto c = rest.substr(0, rest.find(','));
          o.set(copy, c);
          CHECK(o.get(copy) == c);
          rest.remove_prefix(std::min(rest.size(), c.size() + 1));
        }
        break;
      }
    }
  }
  CHECK_THROWS_WITH(rt::set_option(m, "kept_fractoin", "0.1"),
                    Catch::Contains("unknown option 'kept_fractoin'") && Catch::Contains("kept_fraction"));
  rt::set_option(m, "kept_fraction", "0.25");
  CHECK(m.fixed.kept_fraction == 0.25);
  rt::set_option(m, "bucket_mb", "0");
  CHECK(m.bucket_bytes == bucket_per_layer);
  rt::set_option(m, "bucket_mb", "1e12");
  CHECK(m.bucket_bytes == one_bucket);
  CHECK_THROWS_WITH(rt::value_of(rt::compressor_names, "topkk", "compressor"),
                    Catch::Contains("unknown compressor 'topkk'") && Catch::Contains("powersgd"));
}

TEST_CASE("runtime: the composition list is the library's verdict, and every accepted composition steps",
          "[runtime][compositions]") {
  const auto all = rt::compositions();
  REQUIRE(all.size() ==
          std::size(rt::compressor_names) * std::size(rt::collective_names) * std::size(rt::policy_names));
  // Spot checks against the trainer's own checks (composition_checks.hpp).
  const auto find = [&](rt::compressor_id c, rt::collective_id k, rt::policy_id p) {
    for (const auto& x : all)
      if (x.compressor == c && x.collective == k && x.policy == p) return x.verdict;
    FAIL("missing composition");
    return rejection::none;
  };
  CHECK(find(rt::compressor_id::topk, rt::collective_id::allgather, rt::policy_id::gravac) ==
        gravac::detail::composition_verdict<topk, allgather, gravac_policy>());
  CHECK(find(rt::compressor_id::qsgd, rt::collective_id::allreduce_compatible, rt::policy_id::fixed) ==
        rejection::not_summable);
  CHECK(find(rt::compressor_id::powersgd, rt::collective_id::allgather, rt::policy_id::fixed) ==
        rejection::low_rank_needs_allreduces);
  CHECK(find(rt::compressor_id::adacomp, rt::collective_id::allgather, rt::policy_id::accordion) ==
        rejection::decisions_ignored);

  // Catch's macros are not for the rank threads: each rank records what happened, and the
  // main thread checks it.
  const layout lay = small_layout();
  struct outcome {
    std::string refusal;     // the message of a refused composition
    bool stepped = false;    // an accepted one built and stepped twice
    bool finite = false;     // its averages were finite
    bool same_hash = false;  // its layout is the one given
  };
  std::vector<std::vector<outcome>> seen(2, std::vector<outcome>(all.size()));
  run_ranks(2, [&](thread_communicator& comm) {
    for (std::size_t i = 0; i < all.size(); ++i) {
      const auto& x = all[i];
      rt::method_config m;
      m.compressor = x.compressor;
      m.collective = x.collective;
      m.policy = x.policy;
      m.fixed.kept_fraction = 0.1;
      auto& o = seen[static_cast<std::size_t>(comm.rank())][i];
      if (x.verdict != rejection::none) {
        try {
          rt::make_trainer(m, comm, lay);
        } catch (const gravac::error& e) {
          o.refusal = e.what();
        }
        continue;
      }
      auto t = rt::make_trainer(m, comm, lay);
      o.same_hash = t && t->get_layout().hash() == lay.hash();
      o.finite = true;
      for (int s = 0; s < 2; ++s) {
        auto g = gradient(lay.numel(), comm.rank(), s);
        o.stepped = t->step(g).step == static_cast<std::uint64_t>(s);
        for (float v : g) o.finite = o.finite && std::isfinite(v);
      }
    }
  });
  std::size_t accepted = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const auto& x = all[i];
    rt::method_config m;
    m.compressor = x.compressor, m.collective = x.collective, m.policy = x.policy;
    INFO(rt::method_name(m));
    CHECK(rt::verdict(m) == x.verdict);
    for (const auto& rank : seen) {
      const auto& o = rank[i];
      if (x.verdict != rejection::none) {
        CHECK_THAT(o.refusal, Catch::Contains("does not accept " + rt::method_name(m)) &&
                                  Catch::Contains(std::string(to_string(x.verdict))));
      } else {
        CHECK(o.stepped);
        CHECK(o.finite);
        CHECK(o.same_hash);
      }
    }
    if (x.verdict == rejection::none) ++accepted;
  }
  // Every compressor has at least one accepted composition; most triples are refused.
  CHECK(accepted >= std::size(rt::compressor_names));
  CHECK(accepted < all.size());
}

TEST_CASE("runtime: make_trainer's trainer equals trainer<C, K, P> bit for bit, and its state resumes exactly",
          "[runtime][determinism]") {
  const layout lay = small_layout();
  rt::method_config m = rt::recommended(20);
  m.gravac.warmup_steps = 3;
  m.gravac.window = 3;
  // No wall clock in the decisions (same bits every run, under any load): a fixed compute
  // time and no measured codec time. "modeled" still measures compress and decompress, so
  // two trainers timed on a busy machine decided differently (8 of 20 runs under load).
  m.gravac.time.source = time_source::simulated;
  m.gravac.time.include_codec = false;
  m.gravac.time.compute_s = 0.01;
  m.seed = 5;
  constexpr int steps = 30, cut = 17;
  std::vector<std::vector<float>> direct(2), erased(2), resumed(2);
  std::vector<int> differing_steps(2, 0), refused_bad(2, 0);
  run_ranks(2, [&](thread_communicator& comm) {  // no Catch macros in the rank threads
    const auto rank = static_cast<std::size_t>(comm.rank());
    trainer<topk, allgather, gravac_policy> t(comm, lay,
                                              {.compressor = m.topk,
                                               .collective = m.allgather,
                                               .policy = m.gravac,
                                               .seed = m.seed,
                                               .bucket_bytes = m.bucket_bytes});
    auto e = rt::make_trainer(m, comm, lay);
    std::vector<std::byte> state;
    for (int s = 0; s < steps; ++s) {
      auto a = gradient(lay.numel(), comm.rank(), s), b = a;
      t.step(a);
      e->step(b);
      if (a != b) ++differing_steps[rank];
      if (s == cut) state = e->save_state();
      if (s == steps - 1) direct[rank] = a, erased[rank] = b;
    }
    // A fresh trainer loads the state of step `cut` and replays the rest.
    auto r = rt::make_trainer(m, comm, lay);
    r->load_state(state);
    std::vector<float> last;
    for (int s = cut + 1; s < steps; ++s) {
      last = gradient(lay.numel(), comm.rank(), s);
      r->step(last);
    }
    resumed[rank] = last;
    // Bytes that are not a state are refused.
    auto bad = state;
    bad[bad.size() / 2] ^= std::byte{0x5a};
    try {
      r->load_state(bad);
    } catch (const gravac::error&) {
      ++refused_bad[rank];
    }
    try {
      r->load_state(std::span<const std::byte>(state.data(), 10));
    } catch (const gravac::error&) {
      ++refused_bad[rank];
    }
  });
  CHECK(differing_steps == std::vector<int>{0, 0});
  CHECK(refused_bad == std::vector<int>{2, 2});
  CHECK(direct == erased);
  CHECK(resumed == erased);
  CHECK(!rt::recommended().gravac.dense_candidate == false);
  CHECK(rt::preset("dense").compressor == rt::compressor_id::identity);
  CHECK_THROWS_WITH(rt::preset("fastest"),
                    Catch::Contains("unknown preset 'fastest'") && Catch::Contains("recommended"));
}

namespace {
// The erased trainer make_trainer builds for compressor \p id over collective K with the
// fixed policy, against trainer<C, K, fixed_policy>: the same results, bit for bit, over a
// few steps on 2 ranks (so that every name builds its own compressor, not a neighbour's).
template <class C, class K>
bool erased_is(rt::compressor_id id, rt::collective_id k) {
  const layout lay = small_layout();
  rt::method_config m;
  m.compressor = id;
  m.collective = k;
  m.policy = rt::policy_id::fixed;
  m.fixed.kept_fraction = 0.25;
  m.seed = 3;
  std::vector<int> same(2, 0);
  run_ranks(2, [&](thread_communicator& comm) {
    using T = trainer<C, K, fixed_policy>;
    typename T::options o;
    o.policy = m.fixed;
    o.seed = m.seed;
    T t(comm, lay, o);
    auto e = rt::make_trainer(m, comm, lay);
    for (int s = 0; s < 3; ++s) {
      auto a = gradient(lay.numel(), comm.rank(), s), b = a;
      t.step(a);
      e->step(b);
      same[static_cast<std::size_t>(comm.rank())] += a == b;
    }
  });
  return same == std::vector<int>{3, 3};
}
}  // namespace

TEST_CASE("runtime: every compressor name builds that compressor", "[runtime][compositions]") {
  using c = rt::compressor_id;
  const auto ag = rt::collective_id::allgather;
  CHECK(erased_is<identity, dense_allreduce>(c::identity, rt::collective_id::dense_allreduce));
  CHECK(erased_is<topk, allgather>(c::topk, ag));
  CHECK(erased_is<randomk, allgather>(c::randomk, ag));
  CHECK(erased_is<threshold, allgather>(c::threshold, ag));
  CHECK(erased_is<adacomp, allgather>(c::adacomp, ag));
  CHECK(erased_is<qsgd, allgather>(c::qsgd, ag));
  CHECK(erased_is<terngrad, allgather>(c::terngrad, ag));
  CHECK(erased_is<sign, allgather>(c::sign, ag));
  CHECK(erased_is<cast16, allgather>(c::cast16, ag));
  CHECK(erased_is<powersgd, low_rank_allreduce>(c::powersgd, rt::collective_id::low_rank_allreduce));
  CHECK(erased_is<mxfp8, allgather>(c::mxfp8, ag));
  CHECK(erased_is<mxfp4, allgather>(c::mxfp4, ag));
  CHECK(erased_is<nvfp4, allgather>(c::nvfp4, ag));
  CHECK(erased_is<fp8_rowwise, compressed_allreduce>(c::fp8_rowwise, rt::collective_id::compressed_allreduce));
  CHECK(erased_is<sparseloco, allgather>(c::sparseloco, ag));
  // A neighbour's trainer gives other bits: the check can fail.
  CHECK_FALSE(erased_is<nvfp4, allgather>(c::mxfp4, ag));
  STATIC_REQUIRE(std::size(rt::compressor_names) == 15);  // a new name adds a line above
}

namespace {
// docs/options.md: the option table as Markdown, generated from option_table().
std::string options_markdown() {
  std::string s =
      "# Options of a runtime method\n\n"
      "Generated from `gravac::runtime::option_table()` (include/gravac/runtime/option_table.hpp) by\n"
      "`test_runtime`, so it cannot drift from the code (`GRAVAC_UPDATE_DOCS=1` rewrites it). The\n"
      "example's command line spells each as `--name-with-dashes`, gravac-bench likewise, the C ABI\n"
      "and Python as the name itself (`kept_fraction=0.01`).\n\n"
      "| option | type | values | default | what it sets |\n|---|---|---|---|---|\n";
  const rt::method_config m;
  for (const auto& o : rt::option_table()) {
    std::string type, values;
    switch (o.type) {
      case rt::option_type::boolean:
        type = "bool", values = "true, false";
        break;
      case rt::option_type::integer:
        type = "int", values = "[" + rt::detail::number_text(o.min) + ", " + rt::detail::number_text(o.max) + "]";
        break;
      case rt::option_type::real:
        type = "real", values = "[" + rt::detail::number_text(o.min) + ", " + rt::detail::number_text(o.max) + "]";
        break;
      case rt::option_type::choice:
        type = "choice", values = std::string(o.choices);
        break;
    }
    std::replace(values.begin(), values.end(), ',', ' ');
    s += "| `" + std::string(o.name) + "` | " + type + " | " + values + " | " + o.get(m) + " | " + std::string(o.doc) +
         " |\n";
  }
  return s;
}
}  // namespace

TEST_CASE("runtime: docs/options.md is the option table", "[runtime][docs]") {
  const std::string want = options_markdown();
  const std::string path = std::string(GRAVAC_SOURCE_DIR) + "/docs/options.md";
  if (const char* u = std::getenv("GRAVAC_UPDATE_DOCS"); u != nullptr && std::string(u) == "1") {
    std::ofstream(path, std::ios::binary) << want;
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream have;
  have << in.rdbuf();
  INFO("docs/options.md differs from the option table; rerun test_runtime with GRAVAC_UPDATE_DOCS=1 to rewrite it");
  CHECK(have.str() == want);
}
