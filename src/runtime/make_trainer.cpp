// make_trainer, make_local_steps and the composition table, read off composition_verdict
// for every triple of the library's named parts at compile time.
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

// The verdicts under local_steps_policy (adaptive local steps), by compressor and collective.
template <std::size_t... I>
constexpr auto adaptive_verdict_table(std::index_sequence<I...>) {
  return std::array<rejection, sizeof...(I)>{
      gravac::detail::composition_verdict<std::tuple_element_t<I / n_collectives, detail::compressor_types>,
                                          std::tuple_element_t<I % n_collectives, detail::collective_types>,
                                          local_steps_policy>()...};
}
constexpr auto adaptive_verdicts = adaptive_verdict_table(std::make_index_sequence<n_compressors * n_collectives>{});

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

namespace {
// The trainer or local steps \p r asks for, from the compressor's family.
detail::built build(const detail::build_request& r) {
  switch (r.m.compressor) {
    case compressor_id::topk:
      return detail::make_topk(r);
    case compressor_id::randomk:
    case compressor_id::threshold:
      return detail::make_selection(r);
    case compressor_id::qsgd:
    case compressor_id::terngrad:
    case compressor_id::sign:
    case compressor_id::cast16:
      return detail::make_quantizer(r);
    case compressor_id::identity:
    case compressor_id::adacomp:
    case compressor_id::powersgd:
    case compressor_id::sparseloco:
      return detail::make_other(r);
    case compressor_id::mxfp8:
    case compressor_id::mxfp4:
    case compressor_id::nvfp4:
    case compressor_id::fp8_rowwise:
      return detail::make_block_scaled(r);
  }
  throw error(status::invalid_argument, "gravac: unknown compressor id");
}
}  // namespace

std::unique_ptr<any_trainer> make_trainer(const method_config& m, host_comm comm, const layout& lay) {
  require_accepted(m);
  return build({m, comm, lay, nullptr}).trainer;
}

rejection local_verdict(const method_config& m) {
  if (!m.local.adaptive) return verdict_of(m.compressor, m.collective, policy_id::fixed);
  return adaptive_verdicts[static_cast<std::size_t>(m.compressor) * n_collectives +
                           static_cast<std::size_t>(m.collective)];
}

void require_local_accepted(const method_config& m) {
  const std::string rounds = m.local.adaptive ? "adaptive local steps (local_steps_policy)" : "local steps";
  if (m.policy != policy_id::fixed)
    throw error(status::invalid_argument,
                rounds + " take the fixed policy, not " + std::string(name_of(policy_names, m.policy)) +
                    (m.local.adaptive ? ": local_steps_policy chooses the kept fraction of each exchange itself"
                                      : ": each exchange keeps the fixed policy's kept_fraction; local.adaptive "
                                        "chooses H and the fraction from the network"));
  const rejection r = local_verdict(m);
  if (r == rejection::none) return;
  std::string offered;
  for (const auto& k : collective_names) {
    method_config other = m;
    other.collective = k.value;
    if (local_verdict(other) == rejection::none) offered += (offered.empty() ? "" : ", ") + std::string(k.name);
  }
  throw error(status::invalid_argument, "gravac does not accept " + rounds + " over " +
                                            std::string(name_of(compressor_names, m.compressor)) + " + " +
                                            std::string(name_of(collective_names, m.collective)) + ": " +
                                            to_string(r) + ". With " +
                                            std::string(name_of(compressor_names, m.compressor)) + " they accept " +
                                            (offered.empty() ? std::string("no collective") : offered));
}

std::unique_ptr<any_local_steps> make_local_steps(const method_config& m, host_comm comm, const layout& lay,
                                                  std::span<const float> params) {
  require_local_accepted(m);
  return build({m, comm, lay, &params}).local;
}

}  // namespace gravac::runtime
