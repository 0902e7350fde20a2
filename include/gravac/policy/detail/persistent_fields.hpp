#pragma once
//! \file persistent_fields.hpp
//! \brief A policy's persistent state named once, as a list of field descriptors; save and
//! load both walk that list, so the bytes are read in the order they were written by
//! construction, and a new field is one more entry.
//!
//! A list is a type, `field_list<D...>`, whose descriptors say where a value lives (a path of
//! member pointers from the owner) and how it is stored:
//! - `field<&P::a>`, `field<&P::rec_, &record::x>`: the value as it is, but a bool is one
//!   byte (0 or 1, anything else is refused), a std::size_t is 64 bits, a std::vector of
//!   trivially copyable values is length-prefixed (and must hold as many as the owner's
//!   vector does), and a struct with a `persistent_fields` list of its own is that list
//!   (then its `check_loaded(const state_reader&)`, when it has one);
//! - `packed_flags<std::uint8_t, path<...>...>`: bools packed into one integer, the first
//!   path in bit 0 (unknown bits are refused);
//! - `encoded<Stored, encode, decode, &P::a>`: a value derived from a member (for example
//!   "a request is pending" from the request's length); decode may consult the owner.
//! - `constant<T, v>`: a fixed value (a magic number); `interleaved<path<...>...>`: vectors
//!   of one length, element by element.
//!
//! A descriptor is any type with `tops` (the members it touches: `path<...>::tops`),
//! `save(w, root)` and `read(r, root, current)`, so a policy can add one of its own.
//!
//! Loading reads into a field_stage (copies of the members the list touches, not of the whole
//! policy), so the owner is changed only by commit(), after every field was read and checked.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gravac/policy/detail/policy_state.hpp"

namespace gravac::detail {

//! A list of field descriptors, in the order of the bytes.
template <class... Fields>
struct field_list {};

namespace fields_impl {

template <auto V>
struct value_tag {};
template <class... Ts>
struct type_list {};

// Concatenation and de-duplication of type lists (the members a list touches, once each).
template <class... Ls>
struct concat {
  using type = type_list<>;
};
template <class... As>
struct concat<type_list<As...>> {
  using type = type_list<As...>;
};
template <class... As, class... Bs, class... Rest>
struct concat<type_list<As...>, type_list<Bs...>, Rest...> : concat<type_list<As..., Bs...>, Rest...> {};

template <class Out, class... Ts>
struct unique {
  using type = Out;
};
template <class... Out, class T, class... Ts>
struct unique<type_list<Out...>, T, Ts...>
    : std::conditional_t<(std::is_same_v<T, Out> || ...), unique<type_list<Out...>, Ts...>,
                         unique<type_list<Out..., T>, Ts...>> {};
template <class L>
struct unique_of;
template <class... Ts>
struct unique_of<type_list<Ts...>> : unique<type_list<>, Ts...> {};

template <class M>
struct member_traits;
template <class C, class V>
struct member_traits<V C::*> {
  using value = V;
};

// Follows member pointers from \p v.
template <class V>
constexpr V& follow(V& v) noexcept {
  return v;
}
template <auto M, auto... Ms, class V>
constexpr auto& follow(V& v) noexcept {
  return follow<Ms...>(v.*M);
}

template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};

template <class T>
concept has_fields = requires {
  typename T::persistent_fields;
};

}  // namespace fields_impl

//! Where a value lives: the owner's member \p Top, then members of members (\p Rest).
template <auto Top, auto... Rest>
struct path {
  //! The owner's member the value belongs to.
  static constexpr auto top = Top;
  //! The members the path touches (one).
  using tops = fields_impl::type_list<fields_impl::value_tag<Top>>;
  //! The value inside \p v, the value of the top member.
  template <class V>
  static constexpr auto& in_top(V& v) noexcept {
    return fields_impl::follow<Rest...>(v);
  }
};

template <class Owner, class List>
class field_stage;

namespace fields_impl {

template <class Path, class Owner, class List>
auto& resolve(field_stage<Owner, List>& s) noexcept {
  return Path::in_top(s.template get<Path::top>());
}
template <class Path, class Owner, class List>
const auto& resolve(const field_stage<Owner, List>& s) noexcept {
  return Path::in_top(s.template get<Path::top>());
}
template <class Path, class Root>
auto& resolve(Root& r) noexcept {
  return Path::in_top(r.*Path::top);
}

template <class List, class Root>
void save_list(state_writer& w, const Root& root);
template <class List, class Root, class Owner>
void read_list(state_reader& r, Root& root, const Owner& current);

// One plain value: see the file comment for how each kind is stored.
template <class V>
void save_value(state_writer& w, const V& v) {
  if constexpr (std::is_same_v<V, bool>) {
    w.put<std::uint8_t>(v);
  } else if constexpr (std::is_same_v<V, std::size_t>) {
    w.put<std::uint64_t>(v);  // the format does not depend on the platform's size_t
  } else if constexpr (is_vector<V>::value) {
    w.put_vector(v);
  } else if constexpr (has_fields<V>) {
    save_list<typename V::persistent_fields>(w, v);
  } else {
    static_assert(std::is_trivially_copyable_v<V>,
                  "a persistent field must be trivially copyable, a vector or a "
                  "struct with persistent_fields");
    w.put(v);
  }
}
template <class V>
void read_value(state_reader& r, V& v) {
  if constexpr (std::is_same_v<V, bool>) {
    const auto b = r.get<std::uint8_t>();
    if (b > 1) r.fail("corrupt flag");
    v = b != 0;
  } else if constexpr (std::is_same_v<V, std::size_t>) {
    v = static_cast<std::size_t>(r.get<std::uint64_t>());
  } else if constexpr (is_vector<V>::value) {
    r.get_vector(v, v.size());  // the owner's vector has its size already (from the layout or options)
  } else if constexpr (has_fields<V>) {
    read_list<typename V::persistent_fields>(r, v, v);
    if constexpr (requires(const V& cv) { cv.check_loaded(r); }) v.check_loaded(r);
  } else {
    v = r.get<V>();
  }
}

}  // namespace fields_impl

//! The value at path<Top, Rest...>, stored as described in the file comment.
template <auto Top, auto... Rest>
struct field {
  //! The members it touches.
  using tops = typename path<Top, Rest...>::tops;
  //! Appends the value.
  template <class Root>
  static void save(state_writer& w, const Root& root) {
    fields_impl::save_value(w, fields_impl::resolve<path<Top, Rest...>>(root));
  }
  //! Reads the value into \p root (an owner or a stage).
  template <class Root, class Owner>
  static void read(state_reader& r, Root& root, const Owner&) {
    fields_impl::read_value(r, fields_impl::resolve<path<Top, Rest...>>(root));
  }
};

//! Bools packed into one \p Bits, the first path in bit 0. Unknown bits are refused.
template <class Bits, class... Paths>
struct packed_flags {
  static_assert(sizeof...(Paths) <= 8 * sizeof(Bits), "more flags than bits");
  //! The members it touches.
  using tops = typename fields_impl::concat<typename Paths::tops...>::type;
  //! Appends the packed flags.
  template <class Root>
  static void save(state_writer& w, const Root& root) {
    Bits v = 0;
    std::size_t bit = 0;
    ((v = static_cast<Bits>(v | static_cast<Bits>(fields_impl::resolve<Paths>(root) ? 1 : 0) << bit++)), ...);
    w.put(v);
  }
  //! Reads and unpacks them into \p root.
  template <class Root, class Owner>
  static void read(state_reader& r, Root& root, const Owner&) {
    const auto v = r.get<Bits>();
    if (sizeof...(Paths) < 8 * sizeof(Bits) && (v >> sizeof...(Paths)) != 0) r.fail("unknown flags");
    std::size_t bit = 0;
    ((fields_impl::resolve<Paths>(root) = ((v >> bit++) & 1) != 0), ...);
  }
};

//! A \p Stored value derived from the value at path<Top, Rest...>: `Stored Encode(const V&)`
//! writes it, `void Decode(state_reader&, Stored, V&, const Owner& current)` restores the
//! value (and refuses a bad one with state_reader::fail).
template <class Stored, auto Encode, auto Decode, auto Top, auto... Rest>
struct encoded {
  //! The members it touches.
  using tops = typename path<Top, Rest...>::tops;
  //! Appends the encoded value.
  template <class Root>
  static void save(state_writer& w, const Root& root) {
    w.put<Stored>(Encode(fields_impl::resolve<path<Top, Rest...>>(root)));
  }
  //! Reads and decodes it into \p root.
  template <class Root, class Owner>
  static void read(state_reader& r, Root& root, const Owner& current) {
    Decode(r, r.get<Stored>(), fields_impl::resolve<path<Top, Rest...>>(root), current);
  }
};

//! A fixed value (a format's magic number), touching no member; anything else is refused.
template <class T, T Value>
struct constant {
  //! The members it touches (none).
  using tops = fields_impl::type_list<>;
  //! Appends the value.
  template <class Root>
  static void save(state_writer& w, const Root&) {
    w.put(Value);
  }
  //! Reads and checks it.
  template <class Root, class Owner>
  static void read(state_reader& r, Root&, const Owner&) {
    if (r.get<T>() != Value) r.fail("not this policy's state");
  }
};

//! Vectors of one length stored element by element, a[0] b[0] a[1] b[1] ..., with no length
//! (the owner's vectors have theirs already).
template <class... Paths>
struct interleaved {
  //! The members it touches.
  using tops = typename fields_impl::concat<typename Paths::tops...>::type;
  //! Appends the elements.
  template <class Root>
  static void save(state_writer& w, const Root& root) {
    const std::size_t n = std::min({fields_impl::resolve<Paths>(root).size()...});
    for (std::size_t i = 0; i < n; ++i) (w.put(fields_impl::resolve<Paths>(root)[i]), ...);
  }
  //! Reads the elements into \p root.
  template <class Root, class Owner>
  static void read(state_reader& r, Root& root, const Owner&) {
    const std::size_t n = std::min({fields_impl::resolve<Paths>(root).size()...});
    for (std::size_t i = 0; i < n; ++i)
      ((fields_impl::resolve<Paths>(root)[i] =
            r.get<typename std::remove_cvref_t<decltype(fields_impl::resolve<Paths>(root))>::value_type>()),
       ...);
  }
};

//! Copies of the members of \p Owner that field list \p List touches: load() reads into it,
//! checks it, and only then commits it to the owner.
template <class Owner, class... Fields>
class field_stage<Owner, field_list<Fields...>> {
  using tops = typename fields_impl::unique_of<typename fields_impl::concat<typename Fields::tops...>::type>::type;

  template <class Tops>
  struct storage;
  template <auto... Tops>
  struct storage<fields_impl::type_list<fields_impl::value_tag<Tops>...>> {
    using tuple = std::tuple<typename fields_impl::member_traits<decltype(Tops)>::value...>;
    template <auto M>
    static constexpr bool holds = (std::is_same_v<fields_impl::value_tag<M>, fields_impl::value_tag<Tops>> || ...);
    template <auto M>
    static constexpr std::size_t index() noexcept {
      constexpr bool same[] = {std::is_same_v<fields_impl::value_tag<M>, fields_impl::value_tag<Tops>>...};
      std::size_t i = 0;
      while (!same[i]) ++i;
      return i;
    }
    static tuple copy(const Owner& o) { return tuple(o.*Tops...); }
    static void commit(Owner& o, tuple& t) { ((o.*Tops = std::move(std::get<index<Tops>()>(t))), ...); }
  };
  using store = storage<tops>;

 public:
  //! Starts from the owner's values (a vector keeps its length, the count a load expects).
  explicit field_stage(const Owner& o) : values_(store::copy(o)) {}
  //! The staged value of the owner's member \p M (which the list must touch).
  template <auto M>
  [[nodiscard]] auto& get() noexcept {
    static_assert(store::template holds<M>, "field_stage::get: no field of the list touches this member");
    return std::get<store::template index<M>()>(values_);
  }
  //! The staged value of the owner's member \p M.
  template <auto M>
  [[nodiscard]] const auto& get() const noexcept {
    static_assert(store::template holds<M>, "field_stage::get: no field of the list touches this member");
    return std::get<store::template index<M>()>(values_);
  }
  //! Moves the staged values into \p o.
  void commit(Owner& o) && { store::commit(o, values_); }

 private:
  typename store::tuple values_;
};

namespace fields_impl {

template <class... Fields, class Root>
void save_fields_of(field_list<Fields...>*, state_writer& w, const Root& root) {
  (Fields::save(w, root), ...);
}
template <class List, class Root>
void save_list(state_writer& w, const Root& root) {
  save_fields_of(static_cast<List*>(nullptr), w, root);
}
template <class... Fields, class Root, class Owner>
void read_fields_of(field_list<Fields...>*, state_reader& r, Root& root, const Owner& current) {
  (Fields::read(r, root, current), ...);
}
template <class List, class Root, class Owner>
void read_list(state_reader& r, Root& root, const Owner& current) {
  read_fields_of(static_cast<List*>(nullptr), r, root, current);
}

}  // namespace fields_impl

//! Appends the fields of \p List of \p owner, in order.
template <class List, class Owner>
void save_fields(state_writer& w, const Owner& owner) {
  fields_impl::save_list<List>(w, owner);
}

//! Reads the fields of \p List into a stage started from \p owner, which is not changed.
template <class List, class Owner>
[[nodiscard]] field_stage<Owner, List> read_fields(state_reader& r, const Owner& owner) {
  field_stage<Owner, List> s(owner);
  fields_impl::read_list<List>(r, s, owner);
  return s;
}

//! Reads the fields of \p List, requires the end of the bytes, runs `check(const stage&)`
//! (which refuses with state_reader::fail), and only then commits them to \p owner.
template <class List, class Owner, class Check>
void load_fields(state_reader& r, Owner& owner, Check&& check) {
  auto s = read_fields<List>(r, owner);
  r.finish();
  check(std::as_const(s));
  std::move(s).commit(owner);
}

}  // namespace gravac::detail
