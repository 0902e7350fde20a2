#pragma once
//! \file
//! \brief workspace_slot: a collective's workspace for a memory space it does not name
//! (a device compressor's packet buffers, declared by the CUDA backend), held by type: the
//! workspace is created once by prepare() and every later access checks that it is the
//! type asked for, so a collective prepared for one compressor and run with another fails
//! with an error instead of reading the wrong memory.

#include <memory>
#include <string>
#include <typeinfo>
#include <utility>

#include "gravac/core/error.hpp"

namespace gravac {

//! One workspace of a type fixed at emplace(), checked at every get().
class workspace_slot {
 public:
  //! Creates the workspace (replacing any earlier one) and returns it.
  template <class T, class... Args>
  T& emplace(Args&&... args) {
    auto p = std::make_shared<T>(std::forward<Args>(args)...);
    T& ref = *p;
    holder_ = std::move(p);
    type_ = &typeid(T);
    return ref;
  }
  //! The workspace, which must have been created as a \p T; \p who names the caller in the
  //! error otherwise.
  template <class T>
  [[nodiscard]] T& get(const char* who) const {
    if (type_ == nullptr)
      throw error(status::invalid_argument, std::string(who) + ": prepare() was not called for this compressor");
    if (*type_ != typeid(T))
      throw error(status::invalid_argument,
                  std::string(who) + ": the workspace was prepared for another compressor's memory space");
    return *static_cast<T*>(holder_.get());
  }
  //! Whether a workspace was created.
  [[nodiscard]] bool has_value() const noexcept { return type_ != nullptr; }

 private:
  std::shared_ptr<void> holder_;  // owns the T of type_ (deleter captured by make_shared)
  const std::type_info* type_ = nullptr;
};

}  // namespace gravac
