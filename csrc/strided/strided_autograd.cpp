// Autograd for the strided ops, in C++: a kernel registered from Python (torch.library.
// register_autograd) is entered on every call, under no_grad too, and costs ~20 us of host time,
// several times the op's own cost on a small tensor. Calls that need no graph skip the autograd node.
//
// The backward passes call the strided ops through the dispatcher, so they are differentiable
// themselves (double backward) and torch.compile traces them through the fake kernels. Formulas
// (gradient g of the output):
//   map:  id g; neg -g; exp g y; log g / x; relu g [x > 0]; inv -g / x^2; sigmoid g (y - y^2);
//         tanh g - g y^2 (y the output).
//   zip:  torch's derivatives (max / min: 1 to the winner, 1/2 each on ties, as torch.maximum;
//         pow: torch.pow's, masks included); broadcast dims summed back to the input's shape.
//   reduce: sum broadcasts g; prod multiplies g by the product of the other elements (exact with
//         zeros); max / min share g evenly between the elements equal to the result (torch.amax).
//   matmul: g b^T and a^T g over transposed views (no copies), summed over broadcast batch dims.
// Forward-mode AD and the torch.func transforms take the path of common/transforms.h: the kernel's
// value below autograd, the derivatives of the same function written with torch's ops (the strided
// ops' contract is torch's semantics: torch.exp, torch.add, torch.amax, torch.matmul, ...).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "common/transforms.h"
#include "common/vmap.h"
#include "strided/strided.h"

namespace pointops {
namespace strided {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- the ops, through the dispatcher (autograd included when grad mode is on)
const auto& map_handle() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pointops::strided_map", "")
                       .typed<at::Tensor(const at::Tensor&, c10::string_view)>();
  return op;
}

const auto& zip_handle() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pointops::strided_zip", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op;
}

const auto& reduce_handle() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pointops::strided_reduce", "")
                       .typed<at::Tensor(const at::Tensor&, at::OptionalIntArrayRef, c10::string_view, bool)>();
  return op;
}

const auto& matmul_handle() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pointops::strided_matmul", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op;
}

at::Tensor map_op(const at::Tensor& x, c10::string_view fn) { return map_handle().call(x, fn); }
at::Tensor zip_op(const at::Tensor& a, const at::Tensor& b, c10::string_view fn) {
  return zip_handle().call(a, b, fn);
}
at::Tensor reduce_op(const at::Tensor& x, at::OptionalIntArrayRef dim, c10::string_view fn, bool keepdim) {
  return reduce_handle().call(x, dim, fn, keepdim);
}
at::Tensor matmul_op(const at::Tensor& a, const at::Tensor& b) { return matmul_handle().call(a, b); }

bool needs_graph(std::initializer_list<const at::Tensor*> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : inputs)
    if (t->requires_grad()) return true;
  return false;
}

at::Tensor constant(const at::Tensor& like, double value) { return at::full({}, value, like.options()); }

// g summed over the dims that broadcasting added or expanded, to `shape` (a zip / matmul input's).
at::Tensor sum_back_to(const at::Tensor& g, at::IntArrayRef shape) {
  if (g.sizes() == shape) return g;
  const int64_t lead = g.dim() - static_cast<int64_t>(shape.size());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < lead; ++d) dims.push_back(d);
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i)
    if (shape[i] == 1 && g.size(lead + i) != 1) dims.push_back(lead + i);
  if (dims.empty()) return g.reshape(shape);
  return reduce_op(g, dims, "sum", true).reshape(shape);
}

// ---- map
class MapFunction : public torch::autograd::Function<MapFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::string_view fn_name) {
    const MapFn fn = parse_map_fn(fn_name);
    at::Tensor y;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      y = map_op(x, fn_name);
    }
    ctx->saved_data["fn"] = static_cast<int64_t>(fn);
    const bool keep_x = fn == MapFn::Log || fn == MapFn::Relu || fn == MapFn::Inv;
    const bool keep_y = fn == MapFn::Exp || fn == MapFn::Sigmoid || fn == MapFn::Tanh;
    ctx->save_for_backward({keep_x ? x : at::Tensor(), keep_y ? y : at::Tensor()});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &y = saved[1], &g = grads[0];
    at::Tensor gx;
    switch (static_cast<MapFn>(ctx->saved_data["fn"].toInt())) {
      case MapFn::Id: gx = g; break;
      case MapFn::Neg: gx = map_op(g, "neg"); break;
      case MapFn::Exp: gx = zip_op(g, y, "mul"); break;
      case MapFn::Log: gx = zip_op(x, g, "log_back"); break;
      case MapFn::Relu: gx = zip_op(x, g, "relu_back"); break;
      case MapFn::Inv: gx = zip_op(x, g, "inv_back"); break;
      case MapFn::Sigmoid: gx = zip_op(g, zip_op(y, zip_op(y, y, "mul"), "sub"), "mul"); break;  // g (s - s^2)
      case MapFn::Tanh: gx = zip_op(g, zip_op(g, zip_op(y, y, "mul"), "mul"), "sub"); break;     // g - g t^2
    }
    return {gx, at::Tensor()};
  }
};

// ---- zip
// torch.maximum's gradient weights (minimum's with the comparison reversed): 1 where a wins, 0
// where it loses, 1/2 on ties; NaN pairs give 1 to both, as torch's formula does.
std::pair<at::Tensor, at::Tensor> max_min_weights(const at::Tensor& a, const at::Tensor& b, bool max) {
  const at::Tensor& first = max ? a : b;
  const at::Tensor& second = max ? b : a;
  const at::Tensor half_ties = zip_op(zip_op(a, b, "eq"), constant(a, 0.5), "mul");
  const at::Tensor one = constant(a, 1.0);
  at::Tensor wa = zip_op(zip_op(one, zip_op(first, second, "lt"), "sub"), half_ties, "sub");
  at::Tensor wb = zip_op(zip_op(one, zip_op(second, first, "lt"), "sub"), half_ties, "sub");
  return {wa, wb};
}

class ZipFunction : public torch::autograd::Function<ZipFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b, c10::string_view fn_name) {
    const ZipFn fn = parse_zip_fn(fn_name);
    at::Tensor y;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      y = zip_op(a, b, fn_name);
    }
    ctx->saved_data["fn"] = static_cast<int64_t>(fn);
    ctx->saved_data["a_shape"] = a.sizes().vec();
    ctx->saved_data["b_shape"] = b.sizes().vec();
    ctx->save_for_backward({a, b, fn == ZipFn::Pow ? y : at::Tensor()});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1], &y = saved[2], &g = grads[0];
    at::Tensor ga, gb;
    switch (static_cast<ZipFn>(ctx->saved_data["fn"].toInt())) {
      case ZipFn::Add: ga = g, gb = g; break;
      case ZipFn::Sub: ga = g, gb = map_op(g, "neg"); break;
      case ZipFn::Mul: ga = zip_op(g, b, "mul"), gb = zip_op(g, a, "mul"); break;
      case ZipFn::Div: ga = zip_op(g, b, "div"), gb = zip_op(b, zip_op(g, a, "mul"), "inv_back"); break;
      case ZipFn::Max:
      case ZipFn::Min: {
        auto [wa, wb] = max_min_weights(a, b, static_cast<ZipFn>(ctx->saved_data["fn"].toInt()) == ZipFn::Max);
        ga = zip_op(g, wa, "mul"), gb = zip_op(g, wb, "mul");
        break;
      }
      case ZipFn::Pow:  // torch.pow's formulas (derivatives.yaml), masks included
        ga = at::where(b == 0, at::zeros_like(g), g * b * at::pow(a, b - 1));
        gb = g * at::where((a == 0) & (b >= 0), at::zeros_like(y), y * at::log(a));
        break;
      case ZipFn::ReluBack: gb = zip_op(a, g, "relu_back"); break;  // b [a > 0]
      case ZipFn::LogBack:                                           // b / a
        ga = zip_op(a, zip_op(g, b, "mul"), "inv_back"), gb = zip_op(a, g, "log_back");
        break;
      case ZipFn::InvBack:  // -b / a^2: d/da = 2 b / a^3 = -2 inv_back(a, g b) / a
        ga = zip_op(zip_op(zip_op(a, zip_op(g, b, "mul"), "inv_back"), a, "div"), constant(a, -2.0), "mul");
        gb = zip_op(a, g, "inv_back");
        break;
      case ZipFn::Lt:
      case ZipFn::Eq:
      case ZipFn::IsClose: break;  // piecewise constant: zero gradient
    }
    if (ga.defined()) ga = sum_back_to(ga, ctx->saved_data["a_shape"].toIntVector());
    if (gb.defined()) gb = sum_back_to(gb, ctx->saved_data["b_shape"].toIntVector());
    return {ga, gb, at::Tensor()};
  }
};

// ---- reduce
// For every element, the product of the other elements of its reduction (exact with zeros):
// exclusive prefix and suffix products along the reduced dims, permuted to the inside.
at::Tensor prod_of_others(const at::Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) perm.push_back(d);
  const int64_t kept = static_cast<int64_t>(perm.size());
  perm.insert(perm.end(), dims.begin(), dims.end());
  const at::Tensor xt = x.permute(perm);
  std::vector<int64_t> flat_shape(xt.sizes().begin(), xt.sizes().begin() + kept);
  flat_shape.push_back(-1);
  at::Tensor work = xt.reshape(flat_shape);
  if (work.scalar_type() == at::kHalf || work.scalar_type() == at::kBFloat16) work = work.to(at::kFloat);
  const int64_t n = work.size(-1);
  const at::Tensor ones = at::ones_like(work.narrow(-1, 0, 1));
  const at::Tensor pre = at::cat({ones, work.narrow(-1, 0, n - 1).cumprod(-1)}, -1);
  const at::Tensor suf = at::cat({work.narrow(-1, 1, n - 1).flip(-1).cumprod(-1).flip(-1), ones}, -1);
  const at::Tensor others = (pre * suf).to(x.scalar_type()).reshape(xt.sizes());
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  return others.permute(inverse);
}

class ReduceFunction : public torch::autograd::Function<ReduceFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::OptionalIntArrayRef dim,
                            c10::string_view fn_name, bool keepdim) {
    const ReduceFn fn = parse_reduce_fn(fn_name);
    at::Tensor y;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      y = reduce_op(x, dim, fn_name, keepdim);
    }
    ctx->saved_data["fn"] = static_cast<int64_t>(fn);
    const DimList dims = reduced_dims(x, dim);
    ctx->saved_data["dims"] = std::vector<int64_t>(dims.begin(), dims.end());
    ctx->saved_data["x_shape"] = x.sizes().vec();
    const bool extremum = fn == ReduceFn::Max || fn == ReduceFn::Min;
    ctx->save_for_backward({fn != ReduceFn::Sum ? x : at::Tensor(), extremum ? y : at::Tensor()});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &y = saved[1], &g = grads[0];
    const std::vector<int64_t> dims = ctx->saved_data["dims"].toIntVector();
    const std::vector<int64_t> shape = ctx->saved_data["x_shape"].toIntVector();
    if (dims.empty()) return {g.reshape(shape), at::Tensor(), at::Tensor(), at::Tensor()};  // 0-dim x: identity
    std::vector<int64_t> keep_shape = shape;
    for (int64_t d : dims) keep_shape[d] = 1;
    const at::Tensor gk = g.reshape(keep_shape);
    at::Tensor gx;
    switch (static_cast<ReduceFn>(ctx->saved_data["fn"].toInt())) {
      case ReduceFn::Sum: gx = gk.expand(shape); break;
      case ReduceFn::Prod: gx = zip_op(prod_of_others(x, dims), gk, "mul"); break;
      case ReduceFn::Max:
      case ReduceFn::Min: {  // shared evenly between the elements equal to the result (torch.amax's rule)
        const at::Tensor mask = zip_op(x, y.reshape(keep_shape), "eq");
        const at::Tensor count = reduce_op(mask, dims, "sum", true);
        gx = zip_op(mask, zip_op(gk, count, "div"), "mul");
        break;
      }
    }
    return {gx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// ---- matmul
class MatmulFunction : public torch::autograd::Function<MatmulFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->save_for_backward({a, b});
    return matmul_op(a, b);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1], &g = grads[0];
    at::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) ga = sum_back_to(matmul_op(g, b.transpose(-1, -2)), a.sizes());
    if (ctx->needs_input_grad(1)) gb = sum_back_to(matmul_op(a.transpose(-1, -2), g), b.sizes());
    return {ga, gb};
  }
};

// ---- each op as torch ops: the derivative formulas of the transform path
at::Tensor map_formula(const at::Tensor& x, MapFn fn) {
  switch (fn) {
    case MapFn::Id: return x;
    case MapFn::Neg: return at::neg(x);
    case MapFn::Exp: return at::exp(x);
    case MapFn::Log: return at::log(x);
    case MapFn::Sigmoid: return at::sigmoid(x);
    case MapFn::Relu: return at::relu(x);
    case MapFn::Inv: return at::reciprocal(x);
    case MapFn::Tanh: return at::tanh(x);
  }
  TORCH_INTERNAL_ASSERT(false, "unknown map fn");
}

// Undefined for the comparisons: piecewise constant, their derivative is 0 (the kernel's value is
// returned as it is).
at::Tensor zip_formula(const at::Tensor& a, const at::Tensor& b, ZipFn fn) {
  switch (fn) {
    case ZipFn::Add: return at::add(a, b);
    case ZipFn::Sub: return at::sub(a, b);
    case ZipFn::Mul: return at::mul(a, b);
    case ZipFn::Div: return at::div(a, b);
    case ZipFn::Max: return at::maximum(a, b);
    case ZipFn::Min: return at::minimum(a, b);
    case ZipFn::Pow: return at::pow(a, b);
    case ZipFn::ReluBack: return at::where(a > 0, b, at::zeros({}, b.options()));
    case ZipFn::LogBack: return at::div(b, a);
    case ZipFn::InvBack: return at::div(at::neg(b), at::mul(a, a));
    case ZipFn::Lt:
    case ZipFn::Eq:
    case ZipFn::IsClose: return at::Tensor();
  }
  TORCH_INTERNAL_ASSERT(false, "unknown zip fn");
}

at::Tensor reduce_formula(const at::Tensor& x, at::OptionalIntArrayRef dim, ReduceFn fn, bool keepdim) {
  const DimList dims = reduced_dims(x, dim);
  if (dims.empty()) return x;  // a 0-dim x: the identity
  switch (fn) {
    case ReduceFn::Sum: return at::sum(x, dims, keepdim);
    case ReduceFn::Max: return at::amax(x, dims, keepdim);
    case ReduceFn::Min: return at::amin(x, dims, keepdim);
    case ReduceFn::Prod: {  // torch.prod takes one dim at a time
      at::Tensor p = x;
      for (int64_t d : dims) p = at::prod(p, d, /*keepdim=*/true);
      return p.reshape(reduce_output_shape(x, dims, keepdim));
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unknown reduce fn");
}

// ---- the Autograd-key kernels: no node when nothing needs a gradient
at::Tensor map_autograd(c10::DispatchKeySet ks, const at::Tensor& x, c10::string_view fn) {
  if (differentiated_by_transform(x)) {  // common/transforms.h
    return with_derivatives_of(map_handle().call(detached(x), fn), map_formula(x, parse_map_fn(fn)));
  }
  if (!needs_graph({&x})) return map_handle().redispatch(below_autograd(ks), x, fn);
  return MapFunction::apply(x, fn);
}

at::Tensor zip_autograd(c10::DispatchKeySet ks, const at::Tensor& a, const at::Tensor& b, c10::string_view fn) {
  if (any_differentiated_by_transform({&a, &b})) {
    const at::Tensor value = zip_handle().call(detached(a), detached(b), fn);
    const at::Tensor formula = zip_formula(a, b, parse_zip_fn(fn));
    return formula.defined() ? with_derivatives_of(value, formula) : value;
  }
  if (!needs_graph({&a, &b})) return zip_handle().redispatch(below_autograd(ks), a, b, fn);
  return ZipFunction::apply(a, b, fn);
}

at::Tensor reduce_autograd(c10::DispatchKeySet ks, const at::Tensor& x, at::OptionalIntArrayRef dim,
                           c10::string_view fn, bool keepdim) {
  if (differentiated_by_transform(x)) {
    return with_derivatives_of(reduce_handle().call(detached(x), dim, fn, keepdim),
                               reduce_formula(x, dim, parse_reduce_fn(fn), keepdim));
  }
  if (!needs_graph({&x})) return reduce_handle().redispatch(below_autograd(ks), x, dim, fn, keepdim);
  return ReduceFunction::apply(x, dim, fn, keepdim);
}

at::Tensor matmul_autograd(c10::DispatchKeySet ks, const at::Tensor& a, const at::Tensor& b) {
  if (any_differentiated_by_transform({&a, &b})) {
    return with_derivatives_of(matmul_handle().call(detached(a), detached(b)), at::matmul(a, b));
  }
  if (!needs_graph({&a, &b})) return matmul_handle().redispatch(below_autograd(ks), a, b);
  return MatmulFunction::apply(a, b);
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, Autograd, m) {
  m.impl("strided_map", &map_autograd);
  m.impl("strided_zip", &zip_autograd);
  m.impl("strided_reduce", &reduce_autograd);
  m.impl("strided_matmul", &matmul_autograd);
}

// ---- vmap
// vmap batching rules of the strided ops (common/vmap.h). The elementwise ops run on the batched
// value as it is (any layout: the kernels read strides); zip and matmul first give their batched
// operands the vmapped dimension in front and pad their ranks so torch's broadcasting lines the
// samples up; reduce shifts its dims past the vmapped one. One call for every sample.
namespace {

c10::OperatorHandle handle(const char* name) { return c10::Dispatcher::singleton().findSchemaOrThrow(name, ""); }

// t's shape without the vmapped dimension.
std::vector<int64_t> logical_shape(const BatchFold& f, const at::Tensor& t) {
  auto [value, bdim] = f.unwrap(t);
  std::vector<int64_t> shape = value.sizes().vec();
  if (bdim >= 0) shape.erase(shape.begin() + bdim);
  return shape;
}

// A batched operand as (V, 1, ..., 1, *logical) with `rank` dims after V (the 1s pad it to the
// rank of the broadcast); an unbatched one as it is (broadcasting prepends its missing dims).
at::Tensor padded_front(const BatchFold& f, const at::Tensor& t, int64_t rank) {
  if (!f.batched(t)) return t;
  const at::Tensor front = f.front(t);
  std::vector<int64_t> shape{front.size(0)};
  shape.insert(shape.end(), rank - (front.dim() - 1), 1);
  shape.insert(shape.end(), front.sizes().begin() + 1, front.sizes().end());
  return front.view(shape);
}

at::Tensor map_batched(const at::Tensor& x, c10::string_view fn) {
  static const auto op = handle("pointops::strided_map").typed<at::Tensor(const at::Tensor&, c10::string_view)>();
  const BatchFold f({&x});
  if (!f.any_batched()) return op.call(x, fn);
  auto [value, bdim] = f.unwrap(x);
  return f.batched_at(op.call(value, fn), bdim);
}

at::Tensor zip_batched(const at::Tensor& a, const at::Tensor& b, c10::string_view fn) {
  static const auto op =
      handle("pointops::strided_zip").typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  const BatchFold f({&a, &b});
  if (!f.any_batched()) return op.call(a, b, fn);
  const int64_t rank = std::max(logical_shape(f, a).size(), logical_shape(f, b).size());
  return f.batched_front(op.call(padded_front(f, a, rank), padded_front(f, b, rank), fn));
}

at::Tensor matmul_batched(const at::Tensor& a, const at::Tensor& b) {
  static const auto op =
      handle("pointops::strided_matmul").typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  const BatchFold f({&a, &b});
  if (!f.any_batched()) return op.call(a, b);
  const auto a_shape = logical_shape(f, a), b_shape = logical_shape(f, b);
  TORCH_CHECK(a_shape.size() >= 2 && b_shape.size() >= 2, "matmul: a and b need at least 2 dims (each vmapped "
              "sample), got a of shape ", at::IntArrayRef(a_shape), " and b of shape ", at::IntArrayRef(b_shape));
  const int64_t rank = std::max(a_shape.size(), b_shape.size());
  return f.batched_front(op.call(padded_front(f, a, rank), padded_front(f, b, rank)));
}

at::Tensor reduce_batched(const at::Tensor& x, at::OptionalIntArrayRef dim, c10::string_view fn, bool keepdim) {
  static const auto op = handle("pointops::strided_reduce")
                             .typed<at::Tensor(const at::Tensor&, at::OptionalIntArrayRef, c10::string_view, bool)>();
  const BatchFold f({&x});
  if (!f.any_batched()) return op.call(x, dim, fn, keepdim);
  const at::Tensor front = f.front(x);
  // The dims each sample reduces, checked and normalised as the op does, on a tensor of its shape.
  const at::Tensor sample = at::empty(logical_shape(f, x), front.options().device(at::kMeta));
  const DimList dims = reduced_dims(sample, dim);
  parse_reduce_fn(fn);
  if (dims.empty()) return f.batched_front(front.clone());  // a 0-dim sample: the identity
  std::vector<int64_t> shifted;
  for (int64_t d : dims) shifted.push_back(d + 1);
  return f.batched_front(op.call(front, shifted, fn, keepdim));
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, FuncTorchBatched, m) {
  m.impl("strided_map", &map_batched);
  m.impl("strided_zip", &zip_batched);
  m.impl("strided_reduce", &reduce_batched);
  m.impl("strided_matmul", &matmul_batched);
}

}  // namespace strided
}  // namespace pointops
