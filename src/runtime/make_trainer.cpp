// make_trainer and the composition table, read off composition_verdict for every triple of
// the library's named parts at compile time.
#include <array>

#include "dispatch.hpp"

namespace gravac::runtime {
namespace {

constexpr std::size_t n_compressors = std::size(compressor_names);
constexpr std::size_t n_collectives = std::size(collective_names);
constexpr std::size_t n_policies = std::size(policy_names);

template <std::size_t I>
constexpr rejection verdict_at() {
  constexpr std::size_t c = I / (n_collectives * n_policies), k = I / n_policies % n_collectives, p = I % n_policies;
  return gravac::detail::composition_verdict<std::tuple_element_t<c, detail::compressor_types>,
                                             std::tuple_element_t<k, detail::collective_types>,
                                             std::tuple_element_t<p, detail::policy_types>>();
}
template <std::size_t... I>
constexpr auto verdict_table(std::index_sequence<I...>) {
  return std::array<rejection, sizeof...(I)>{verdict_at<I>()...};
}
constexpr auto verdicts = verdict_table(std::make_index_sequence<n_compressors * n_collectives * n_policies>{});

rejection verdict_of(compressor_id c, collective_id k, policy_id p) {
  return verdicts[(static_cast<std::size_t>(c) * n_collectives + static_cast<std::size_t>(k)) * n_policies +
                  static_cast<std::size_t>(p)];
}

}  // namespace

rejection verdict(const method_config& m) { return verdict_of(m.compressor, m.collective, m.policy); }

std::vector<composition> compositions() {
  std::vector<composition> out;
  for (const auto& c : compressor_names)
    for (const auto& k : collective_names)
      for (const auto& p : policy_names) out.push_back({c.value, k.value, p.value, verdict_of(c.value, k.value, p.value)});
  return out;
}

void require_accepted(const method_config& m) {
  const rejection r = verdict(m);
  if (r == rejection::none) return;
  // What the library does accept with this compressor, so the message says what to do.
  std::string offered;
  for (const auto& k : collective_names) {
    std::string policies;
    for (const auto& p : policy_names)
      if (verdict_of(m.compressor, k.value, p.value) == rejection::none)
        policies += (policies.empty() ? "" : ", ") + std::string(p.name);
    if (!policies.empty()) offered += (offered.empty() ? "" : "; ") + std::string(k.name) + " with " + policies;
  }
  // And, when the collective refused, the compressors it takes with this policy.
  std::string takes;
  if (r != rejection::decisions_ignored)
    for (const auto& c : compressor_names)
      if (verdict_of(c.value, m.collective, m.policy) == rejection::none)
        takes += (takes.empty() ? "" : ", ") + std::string(c.name);
  const std::string collective(name_of(collective_names, m.collective));
  throw error(status::invalid_argument,
              "gravac does not accept " + method_name(m) + ": " + to_string(r) + ". With " +
                  std::string(name_of(compressor_names, m.compressor)) + " it accepts " +
                  (offered.empty() ? std::string("nothing") : offered) +
                  (takes.empty() ? "" : ". " + collective + " with " + std::string(name_of(policy_names, m.policy)) +
                                            " takes " + takes));
}

std::unique_ptr<any_trainer> make_trainer(const method_config& m, host_comm comm, const layout& lay) {
  require_accepted(m);
  switch (m.compressor) {
    case compressor_id::topk:
      return detail::make_topk(m, comm, lay);
    case compressor_id::randomk:
    case compressor_id::threshold:
      return detail::make_selection(m, comm, lay);
    case compressor_id::qsgd:
    case compressor_id::terngrad:
    case compressor_id::sign:
    case compressor_id::cast16:
      return detail::make_quantizer(m, comm, lay);
    case compressor_id::identity:
    case compressor_id::adacomp:
    case compressor_id::powersgd:
      return detail::make_other(m, comm, lay);
    case compressor_id::mxfp8:
    case compressor_id::mxfp4:
    case compressor_id::nvfp4:
    case compressor_id::fp8_rowwise:
      return detail::make_block_scaled(m, comm, lay);
  }
  throw error(status::invalid_argument, "gravac: unknown compressor id");
}

}  // namespace gravac::runtime
