// ddprun's pickle reader (pickle.hpp): Python's torch.save pickles, weights-only.
#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "pickle.hpp"

namespace ddprun::worker::pickle {

const std::map<std::string, at::ScalarType>& storage_types() {
  static const std::map<std::string, at::ScalarType> types{{"FloatStorage", at::kFloat},
                                                           {"DoubleStorage", at::kDouble},
                                                           {"HalfStorage", at::kHalf},
                                                           {"BFloat16Storage", at::kBFloat16},
                                                           {"LongStorage", at::kLong},
                                                           {"IntStorage", at::kInt},
                                                           {"ShortStorage", at::kShort},
                                                           {"CharStorage", at::kChar},
                                                           {"ByteStorage", at::kByte},
                                                           {"BoolStorage", at::kBool},
                                                           {"ComplexFloatStorage", at::kComplexFloat},
                                                           {"ComplexDoubleStorage", at::kComplexDouble},
                                                           {"UntypedStorage", at::kByte}};
  return types;
}

std::string printable(const std::string& s) {
  std::string out;
  for (const unsigned char c : s.substr(0, 200)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return s.size() > 200 ? out + "..." : out;
}

namespace {

// The callables and classes a torch.save file may name.
enum class Global {
  kOrderedDict,       // collections.OrderedDict: a dict
  kRebuildTensor,     // torch._utils._rebuild_tensor_v2: a tensor viewing a storage
  kRebuildParameter,  // torch._utils._rebuild_parameter(_with_state): nn.Parameter's data
  kPassThrough,       // torch.jit._pickle.restore_type_tag and build_*list (TorchScript's tags), torch.Size
  kStorageType,       // torch.FloatStorage and the like: the element type of a persistent storage
};

struct Item {
  enum class Kind { kValue, kGlobal, kStorage, kTuple };
  Kind kind = Kind::kValue;
  c10::IValue value;        // kValue; kStorage: the whole storage as a 1-D tensor
  Global global{};          // kGlobal
  at::ScalarType dtype{};   // kGlobal (kStorageType)
  std::vector<Item> parts;  // kTuple: a tuple holding a global or a storage (arguments, persistent ids)
};

class Unpickler {
 public:
  Unpickler(const char* data, size_t size, StorageLoader load_storage, std::string what)
      : data_(data), size_(size), load_storage_(std::move(load_storage)), what_(std::move(what)) {}

  c10::IValue run() {
    for (;;) {
      const size_t at = pos_;
      const uint8_t op = u8();
      if (op == '.') break;  // STOP
      step(op, at);
    }
    if (stack_.size() != 1)
      fail("the pickle ends with " + std::to_string(stack_.size()) + " values on its stack, not 1");
    return value_of(stack_.back(), "the file's value");
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error(what_ + ": " + why + " (byte " + std::to_string(op_at_) + " of its pickle)");
  }

  void need(size_t n) const {
    if (n > size_ - pos_) fail("the pickle is truncated");
  }
  uint8_t u8() {
    need(1);
    return static_cast<uint8_t>(data_[pos_++]);
  }
  uint64_t le(size_t n) {
    need(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
    pos_ += n;
    return v;
  }
  std::string bytes(uint64_t n) {
    if (n > size_ - pos_) fail("a string runs past the end of the pickle");
    std::string s(data_ + pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  std::string line() {
    const void* nl = std::memchr(data_ + pos_, '\n', size_ - pos_);
    if (!nl) fail("a GLOBAL name has no end of line");
    const size_t n = static_cast<size_t>(static_cast<const char*>(nl) - (data_ + pos_));
    std::string s(data_ + pos_, n);
    pos_ += n + 1;
    return s;
  }

  Item pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("the pickle pops an empty stack");
    Item it = std::move(stack_.back());
    stack_.pop_back();
    return it;
  }
  Item& top() {
    if (stack_.empty()) fail("the pickle reads an empty stack");
    return stack_.back();
  }
  std::vector<Item> pop_mark() {
    if (marks_.empty()) fail("the pickle closes a MARK it never opened");
    const size_t from = marks_.back();
    marks_.pop_back();
    std::vector<Item> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(from)),
                            std::make_move_iterator(stack_.end()));
    stack_.resize(from);
    return items;
  }
  void push(c10::IValue v) {
    Item it;
    it.value = std::move(v);
    stack_.push_back(std::move(it));
  }

  // The value an item stands for, where only data may go (a container, the file's result).
  c10::IValue value_of(const Item& it, const char* where) const {
    switch (it.kind) {
      case Item::Kind::kValue: return it.value;
      case Item::Kind::kGlobal: fail(std::string("a class or function stands where data must (") + where + ")");
      case Item::Kind::kStorage: fail(std::string("a bare storage stands where data must (") + where + ")");
      case Item::Kind::kTuple:
        fail(std::string("a tuple of classes or storages stands where data must (") + where + ")");
    }
    fail("unknown item");
  }

  int depth_of(const c10::IValue& v) const {
    if (!v.isList() && !v.isGenericDict() && !v.isTuple()) return 0;
    auto it = depth_.find(v.internalToPointer());
    return it == depth_.end() ? 1 : it->second;
  }
  void contains(const c10::IValue& container, const c10::IValue& element) {
    const int d = depth_of(element) + 1;
    int& mine = depth_[container.internalToPointer()];
    mine = std::max({mine, 1, d});
    if (mine > kMaxDepth) fail("containers are nested more than " + std::to_string(kMaxDepth) + " deep");
  }

  Item make_tuple(std::vector<Item> items) {
    Item out;
    bool plain = true;
    for (const auto& i : items) plain = plain && i.kind == Item::Kind::kValue;
    if (!plain) {
      out.kind = Item::Kind::kTuple;
      out.parts = std::move(items);
      return out;
    }
    std::vector<c10::IValue> elements;
    elements.reserve(items.size());
    for (auto& i : items) elements.push_back(std::move(i.value));
    out.value = c10::ivalue::Tuple::create(std::move(elements));
    for (const auto& e : out.value.toTupleRef().elements()) contains(out.value, e);
    return out;
  }

  static std::vector<Item> tuple_parts(const Item& t) {
    if (t.kind == Item::Kind::kTuple) return t.parts;
    std::vector<Item> parts;
    if (t.kind == Item::Kind::kValue && t.value.isTuple()) {
      for (const auto& e : t.value.toTupleRef().elements()) {
        Item i;
        i.value = e;
        parts.push_back(std::move(i));
      }
    }
    return parts;
  }

  void set_item(const c10::IValue& dict, Item key, Item value) {
    if (!dict.isGenericDict()) fail("SETITEM on something that is not a dict");
    const c10::IValue k = value_of(key, "a dict key"), v = value_of(value, "a dict value");
    if (!k.isString() && !k.isInt() && !k.isBool() && !k.isDouble()) {
      fail("a dict key is a " + k.tagKind() + " (ddprun reads str, int, float and bool keys)");
    }
    contains(dict, v);
    dict.toGenericDict().insert_or_assign(k, v);
  }
  void append(const c10::IValue& list, const Item& value) {
    if (!list.isList()) fail("APPEND on something that is not a list");
    const c10::IValue v = value_of(value, "a list element");
    contains(list, v);
    list.toList().push_back(v);
  }

  Item resolve_global(const std::string& module, const std::string& name) {
    Item g;
    g.kind = Item::Kind::kGlobal;
    const std::string full = module + "." + name;
    if (full == "collections.OrderedDict") {
      g.global = Global::kOrderedDict;
    } else if (full == "torch._utils._rebuild_tensor_v2") {
      g.global = Global::kRebuildTensor;
    } else if (full == "torch._utils._rebuild_parameter" || full == "torch._utils._rebuild_parameter_with_state") {
      g.global = Global::kRebuildParameter;
    } else if (full == "torch.jit._pickle.restore_type_tag" || full == "torch.jit._pickle.build_intlist" ||
               full == "torch.jit._pickle.build_doublelist" || full == "torch.jit._pickle.build_boollist" ||
               full == "torch.jit._pickle.build_tensorlist" || full == "torch.Size") {
      g.global = Global::kPassThrough;
    } else if (module == "torch" && storage_types().count(name)) {
      g.global = Global::kStorageType;
      g.dtype = storage_types().at(name);
    } else {
      fail("the file holds a Python object of " + printable(full) +
           ", which ddprun does not load: it reads what torch.load(weights_only=True) reads (tensors, state "
           "dicts, dicts, lists and tuples of numbers, strings and None); save plain state dicts");
    }
    return g;
  }

  static int64_t int_of(const Item& i, bool& ok) {
    ok = i.kind == Item::Kind::kValue && i.value.isInt();
    return ok ? i.value.toInt() : 0;
  }
  std::vector<int64_t> ints_of(const Item& t, const char* what) {
    if (t.kind != Item::Kind::kValue || !t.value.isTuple()) fail(std::string("a tensor's ") + what + " is not a tuple");
    std::vector<int64_t> out;
    for (const auto& e : t.value.toTupleRef().elements()) {
      if (!e.isInt() || e.toInt() < 0) fail(std::string("a tensor's ") + what + " holds something not a count");
      out.push_back(e.toInt());
    }
    return out;
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
  c10::IValue rebuild_tensor(const std::vector<Item>& a) {
    if (a.size() < 4 || a[0].kind != Item::Kind::kStorage) fail("_rebuild_tensor_v2 without a storage");
    bool ok = false;
    const int64_t offset = int_of(a[1], ok);
    if (!ok || offset < 0) fail("a tensor's storage offset is not a count");
    const auto sizes = ints_of(a[2], "size"), strides = ints_of(a[3], "stride");
    if (sizes.size() != strides.size())
      fail("a tensor has " + std::to_string(sizes.size()) + " sizes but " + std::to_string(strides.size()) +
           " strides");
    const at::Tensor& base = a[0].value.toTensor();
    int64_t last = offset;  // the last element the view reads
    bool empty = false;
    for (size_t d = 0; d < sizes.size(); ++d) {
      int64_t span = 0;
      if (sizes[d] == 0) empty = true;
      if (sizes[d] > 0 &&
          (__builtin_mul_overflow(sizes[d] - 1, strides[d], &span) || __builtin_add_overflow(last, span, &last))) {
        fail("a tensor's size and stride overflow");
      }
    }
    if (!empty && last >= base.numel()) {
      fail("a tensor reads element " + std::to_string(last) + " of a storage of " + std::to_string(base.numel()));
    }
    return at::empty({0}, base.options()).set_(base.storage(), offset, sizes, strides);
  }

  Item call(const Item& fn, const Item& args) {
    if (fn.kind != Item::Kind::kGlobal) fail("REDUCE calls something that is not a class or function");
    const std::vector<Item> a = tuple_parts(args);
    Item out;
    switch (fn.global) {
      case Global::kOrderedDict:
        if (!a.empty()) fail("OrderedDict is built from arguments (ddprun reads the form torch.save writes)");
        out.value = c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
        return out;
      case Global::kRebuildTensor: out.value = rebuild_tensor(a); return out;
      case Global::kRebuildParameter:
      case Global::kPassThrough:
        if (a.empty()) fail("a PyTorch helper is called without arguments");
        if (fn.global == Global::kRebuildParameter && !(a[0].kind == Item::Kind::kValue && a[0].value.isTensor())) {
          fail("_rebuild_parameter of something that is not a tensor");
        }
        out.value = value_of(a[0], "an argument");
        return out;
      case Global::kStorageType:
        fail("a storage class is called (ddprun reads storages as torch.save writes them: by persistent id)");
    }
    fail("unknown callable");
  }

  // ('storage', storage_type, key, location, numel)
  Item persistent(const Item& pid) {
    const std::vector<Item> p = tuple_parts(pid);
    if (p.size() != 5 ||
        !(p[0].kind == Item::Kind::kValue && p[0].value.isString() && p[0].value.toStringRef() == "storage")) {
      fail("a persistent id that is not ('storage', type, key, location, numel)");
    }
    if (p[1].kind != Item::Kind::kGlobal || p[1].global != Global::kStorageType) fail("a storage of no storage type");
    if (!(p[2].kind == Item::Kind::kValue && p[2].value.isString())) fail("a storage key that is not a string");
    bool ok = false;
    const int64_t numel = int_of(p[4], ok);
    if (!ok || numel < 0) fail("a storage's size is not a count");
    const std::string& key = p[2].value.toStringRef();
    auto it = storages_.find(key);
    if (it == storages_.end()) {
      it = storages_.emplace(key, load_storage_(key, p[1].dtype, numel)).first;
    } else if (it->second.scalar_type() != p[1].dtype || it->second.numel() != numel) {
      fail("storage " + printable(key) + " is named twice with different types or sizes");
    }
    Item s;
    s.kind = Item::Kind::kStorage;
    s.value = it->second;
    return s;
  }

  void step(uint8_t op, size_t at) {
    op_at_ = at;
    switch (op) {
      case 0x80: u8(); return;                            // PROTO
      case 0x95: le(8); return;                           // FRAME
      case '(': marks_.push_back(stack_.size()); return;  // MARK
      case '0': pop(); return;                            // POP
      case '1': pop_mark(); return;                       // POP_MARK
      case '2': {
        Item copy = top();
        stack_.push_back(std::move(copy));
        return;
      }                                                                           // DUP
      case 'N': push(c10::IValue()); return;                                      // NONE
      case 0x88: push(true); return;                                              // NEWTRUE
      case 0x89: push(false); return;                                             // NEWFALSE
      case 'J': push(static_cast<int64_t>(static_cast<int32_t>(le(4)))); return;  // BININT
      case 'K': push(static_cast<int64_t>(le(1))); return;                        // BININT1
      case 'M': push(static_cast<int64_t>(le(2))); return;                        // BININT2
      case 0x8a:                                                                  // LONG1
      case 0x8b: {                                                                // LONG4
        const uint64_t n = op == 0x8a ? le(1) : le(4);
        if (n > 8) fail("an integer of " + std::to_string(n) + " bytes (ddprun reads 64-bit integers)");
        uint64_t v = n ? le(static_cast<size_t>(n)) : 0;
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
        push(static_cast<int64_t>(v));
        return;
      }
      case 'G': {  // BINFLOAT: big-endian
        need(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(data_[pos_ + i]);
        pos_ += 8;
        double d;
        std::memcpy(&d, &bits, sizeof d);
        push(d);
        return;
      }
      case 0x8c:
      case 'U': push(bytes(le(1))); return;  // SHORT_BINUNICODE, SHORT_BINSTRING
      case 'X':
      case 'T': push(bytes(le(4))); return;                        // BINUNICODE, BINSTRING
      case 0x8d: push(bytes(le(8))); return;                       // BINUNICODE8
      case ')': stack_.push_back(make_tuple({})); return;          // EMPTY_TUPLE
      case 't': stack_.push_back(make_tuple(pop_mark())); return;  // TUPLE
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        std::vector<Item> items(static_cast<size_t>(op - 0x84));
        for (size_t i = items.size(); i-- > 0;) items[i] = pop();
        stack_.push_back(make_tuple(std::move(items)));
        return;
      }
      case ']': push(c10::impl::GenericList(c10::AnyType::get())); return;  // EMPTY_LIST
      case 'l': {                                                           // LIST
        auto items = pop_mark();
        push(c10::impl::GenericList(c10::AnyType::get()));
        for (auto& i : items) append(top().value, i);
        return;
      }
      case 'a': {
        Item v = pop();
        append(top().value, v);
        return;
      }            // APPEND
      case 'e': {  // APPENDS
        auto items = pop_mark();
        for (auto& i : items) append(top().value, i);
        return;
      }
      case '}': push(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get())); return;  // EMPTY_DICT
      case 'd':
      case 'u': {  // DICT, SETITEMS
        auto items = pop_mark();
        if (items.size() % 2) fail("a dict of an odd number of keys and values");
        if (op == 'd') push(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
        const c10::IValue dict = top().value;
        for (size_t i = 0; i < items.size(); i += 2) set_item(dict, std::move(items[i]), std::move(items[i + 1]));
        return;
      }
      case 's': {  // SETITEM
        Item v = pop(), k = pop();
        set_item(top().value, std::move(k), std::move(v));
        return;
      }
      case 'c': {  // GLOBAL
        const std::string module = line();
        stack_.push_back(resolve_global(module, line()));
        return;
      }
      case 0x93: {  // STACK_GLOBAL
        const Item name = pop(), module = pop();
        const c10::IValue n = value_of(name, "a global's name"), m = value_of(module, "a global's module");
        if (!n.isString() || !m.isString()) fail("STACK_GLOBAL of something not a string");
        stack_.push_back(resolve_global(m.toStringRef(), n.toStringRef()));
        return;
      }
      case 'R': {  // REDUCE
        const Item args = pop(), fn = pop();
        stack_.push_back(call(fn, args));
        return;
      }
      case 'b': {  // BUILD: only an OrderedDict's instance state; a state dict's _metadata is kept as a key
        const Item state = pop();
        const Item& obj = top();
        if (!(obj.kind == Item::Kind::kValue && obj.value.isGenericDict())) fail("BUILD of something not a dict");
        if (state.kind == Item::Kind::kValue && state.value.isGenericDict()) {
          auto meta = state.value.toGenericDict().find("_metadata");
          if (meta != state.value.toGenericDict().end() && meta->value().isGenericDict()) {
            contains(obj.value, meta->value());
            obj.value.toGenericDict().insert_or_assign("_metadata", meta->value());
          }
        }
        return;
      }
      case 'Q': {
        const Item pid = pop();
        stack_.push_back(persistent(pid));
        return;
      }                                                                       // BINPERSID
      case 'q': memo_[static_cast<uint32_t>(le(1))] = top(); return;          // BINPUT
      case 'r': memo_[static_cast<uint32_t>(le(4))] = top(); return;          // LONG_BINPUT
      case 0x94: memo_[static_cast<uint32_t>(memo_.size())] = top(); return;  // MEMOIZE
      case 'h':
      case 'j': {  // BINGET, LONG_BINGET
        const auto id = static_cast<uint32_t>(op == 'h' ? le(1) : le(4));
        auto it = memo_.find(id);
        if (it == memo_.end()) fail("the pickle reads memo " + std::to_string(id) + ", never stored");
        stack_.push_back(it->second);
        return;
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        fail(std::string("pickle opcode ") + hex + " is not one torch.save writes for data");
      }
    }
  }

  const char* data_;
  size_t size_;
  size_t pos_ = 0, op_at_ = 0;
  StorageLoader load_storage_;
  std::string what_;
  std::vector<Item> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, Item> memo_;
  std::unordered_map<std::string, at::Tensor> storages_;
  std::unordered_map<const void*, int> depth_;
};

}  // namespace

c10::IValue read(const char* data, size_t size, StorageLoader load_storage, const std::string& what) {
  return Unpickler(data, size, std::move(load_storage), what).run();
}

}  // namespace ddprun::worker::pickle
