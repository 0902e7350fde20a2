#pragma once
//! \file
//! \brief Which compressor x collective x policy compositions are valid, and why the others
//! are not: what a policy decides, what a compressor acts on, and the opt-in for a
//! composition whose decisions the compressor would ignore.
//!
//! A policy fills step_params each step; a compressor reads some of it. A policy whose
//! decisions the compressor never reads (Accordion's kept fractions with AdaComp, which
//! chooses per bin by itself) would run, cost its statistics, and change nothing: such a
//! composition does not compile unless it is asked for explicitly
//! (`allow_ignored_decisions<C, P>`). docs/compositions.md lists every composition of the
//! library's types, generated from these traits by a test.

#include <cstdint>
#include <string>

namespace gravac {

//! The per-layer decisions of a step (step_params, or a compressor's step settings) that
//! a policy makes or a compressor acts on; a bit set.
enum class decision : std::uint8_t {
  none = 0,
  kept_fraction = 1,       //!< step_params::kept_fraction below 1: how much of a layer to send
  approximation_rank = 2,  //!< powersgd_settings::approximation_rank: PowerSGD's rank
  bin_length = 4,          //!< adacomp_settings::bin_length: AdaComp's bin length L_T
};

//! Union of two decision sets.
constexpr decision operator|(decision a, decision b) noexcept {
  return static_cast<decision>(static_cast<std::uint8_t>(a) | static_cast<std::uint8_t>(b));
}
//! Intersection of two decision sets.
constexpr decision operator&(decision a, decision b) noexcept {
  return static_cast<decision>(static_cast<std::uint8_t>(a) & static_cast<std::uint8_t>(b));
}

//! The names of the decisions in \p d, joined by " and " ("nothing" for none).
inline std::string to_string(decision d) {
  std::string s;
  const auto add = [&](decision bit, const char* name) {
    if ((d & bit) == decision::none) return;
    if (!s.empty()) s += " and ";
    s += name;
  };
  add(decision::kept_fraction, "kept fraction");
  add(decision::approximation_rank, "rank");
  add(decision::bin_length, "bin length");
  return s.empty() ? "nothing" : s;
}

//! What compressor \p C acts on: `C::acts_on` when it declares it, else the kept fraction
//! (what a sparsifier reads; every compressor also honours a kept fraction of 1 as "send
//! this layer raw", which is not counted as acting on the decision).
template <class C>
inline constexpr decision acts_on_v = [] {
  if constexpr (requires { C::acts_on; })
    return static_cast<decision>(C::acts_on);
  else
    return decision::kept_fraction;
}();

//! What policy \p P decides step by step: `P::decides` when it declares it, else nothing
//! (a policy that sets a fixed configuration, as fixed_policy, fits every compressor).
template <class P>
inline constexpr decision decides_v = [] {
  if constexpr (requires { P::decides; })
    return static_cast<decision>(P::decides);
  else
    return decision::none;
}();

//! Specialise to true to compose policy \p P with compressor \p C although \p C ignores
//! every decision \p P makes (e.g. to measure the policy's cost alone).
template <class C, class P>
inline constexpr bool allow_ignored_decisions = false;

//! Policy \p P's decisions reach compressor \p C: P decides nothing, or C acts on at least
//! one of its decisions, or the user opted in.
template <class C, class P>
inline constexpr bool decisions_reach_v = decides_v<P> == decision::none ||
                                          (decides_v<P> & acts_on_v<C>) != decision::none
                                          || allow_ignored_decisions<C, P>;

//! Why a composition is refused (none: it is valid). The trainer's static assertions and
//! the generated composition table both use it.
enum class rejection : std::uint8_t {
  none,                       //!< valid
  not_summable,               //!< allreduce_compatible with a compressor whose values cannot be summed
  no_index_hook,              //!< allreduce_compatible with a summable compressor without select_indices
  no_device_index_hook,       //!< allreduce_compatible with a device compressor without the hook's device form
  not_low_rank,               //!< low_rank_allreduce with a compressor that is not a LowRankCompressor
  low_rank_needs_allreduces,  //!< allgather with PowerSGD
  not_accepted,               //!< a collective's own accepts<C> said no
  decisions_ignored,          //!< the compressor acts on none of the policy's decisions
};

//! One line on why \p r (the table's wording).
constexpr const char* to_string(rejection r) noexcept {
  switch (r) {
    case rejection::none:
      return "valid";
    case rejection::not_summable:
      return "values cannot be summed at shared indices";
    case rejection::no_index_hook:
      return "no index-selection hook";
    case rejection::no_device_index_hook:
      return "no device-memory index-selection hook";
    case rejection::not_low_rank:
      return "not a LowRankCompressor";
    case rejection::low_rank_needs_allreduces:
      return "PowerSGD needs two dependent Allreduces";
    case rejection::not_accepted:
      return "the collective does not accept it";
    case rejection::decisions_ignored:
      return "the compressor ignores the policy's decisions";
  }
  return "?";
}

}  // namespace gravac
