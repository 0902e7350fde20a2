#pragma once
//! \file
//! \brief The trainer's side of a compressor's per-step settings (Compressor's
//! step_settings, docs/concept_compressor.md): which compressors have them,
//! the settings the trainer holds for one (nothing for the others) and a bucket's slice of
//! them (their hash for the consistency check: consistency.hpp).

#include <cstddef>
#include <cstdint>
#include <tuple>

namespace gravac::detail {

//! A compressor with per-step settings: `using step_settings = S;` and
//! `set_step_settings(const S&)`.
template <class C>
concept HasStepSettings = requires {
  typename C::step_settings;
}
&&requires(C& c, const typename C::step_settings& s) { c.set_step_settings(s); };

//! What the trainer holds for a compressor without per-step settings.
struct no_step_settings {};

//! The per-step settings of \p C, or no_step_settings.
template <class C>
struct step_settings_of {
  using type = no_step_settings;  //!< none
};
//! The per-step settings of \p C.
template <HasStepSettings C>
struct step_settings_of<C> {
  using type = typename C::step_settings;  //!< C's
};
//! The per-step settings of \p C, or no_step_settings.
template <class C>
using step_settings_for = typename step_settings_of<C>::type;

//! A policy that decides the settings \p S: `plan_settings(S&)`.
template <class P, class S>
concept PlansSettings = requires(P& p, S& s) {
  p.plan_settings(s);
};

//! Into \p mine, the layers [\p first, \p last) of \p whole, settings for a layout of
//! \p layers layers: each per-layer vector of the whole layout's size is cut, any other
//! (empty: the compressor's own) is copied as it is. Reuses mine's memory.
template <class S>
void slice_step_settings(const S& whole, std::size_t first, std::size_t last, std::size_t layers, S& mine) {
  std::apply(
      [&](const auto&... w) {
        std::apply(
            [&](auto&... m) {
              const auto cut = [&](const auto& from, auto& to) {
                if (from.size() == layers)
                  to.assign(from.begin() + static_cast<std::ptrdiff_t>(first),
                            from.begin() + static_cast<std::ptrdiff_t>(last));
                else
                  to.assign(from.begin(), from.end());
              };
              (cut(w, m), ...);
            },
            mine.per_layer());
      },
      whole.per_layer());
}

}  // namespace gravac::detail
