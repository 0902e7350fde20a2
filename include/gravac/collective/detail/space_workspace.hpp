#pragma once
//! \file
//! \brief detail::space_workspace: a collective's workspace W<Space> for the memory space of
//! the compressor it was prepared for. Host memory's is a plain member (no lookup on the
//! host path); any other space's lives in a workspace_slot, because the core headers cannot
//! name its type (device buffers are declared by the CUDA backend) and every use is checked
//! against the type prepare() created.

#include <concepts>

#include "gravac/collective/workspace_slot.hpp"
#include "gravac/core/memory.hpp"

namespace gravac::detail {

//! One workspace of type \p W<Space>, for host_space or for the space of the last prepare().
template <template <class> class W>
class space_workspace {
 public:
  //! The workspace of \p Space, created (any space but the host's, replacing an earlier
  //! one) or kept (the host's, with its memory): prepare() sizes it after this call.
  template <class Space>
  W<Space>& prepare() {
    if constexpr (std::same_as<Space, host_space>)
      return host_;
    else
      return other_.emplace<W<Space>>();
  }
  //! The workspace of \p Space; outside host memory it must have been prepared for \p Space
  //! (\p who names the collective in the error otherwise).
  template <class Space>
  [[nodiscard]] W<Space>& get(const char* who) {
    if constexpr (std::same_as<Space, host_space>)
      return host_;
    else
      return other_.get<W<Space>>(who);
  }
  //! The workspace of \p Space, read only (see get()).
  template <class Space>
  [[nodiscard]] const W<Space>& get(const char* who) const {
    if constexpr (std::same_as<Space, host_space>)
      return host_;
    else
      return other_.get<W<Space>>(who);
  }

 private:
  W<host_space> host_;
  workspace_slot other_;
};

}  // namespace gravac::detail
