"""Torch functions, Tensor methods and properties, operators, nn.functional, dtypes, devices."""

import math
import operator

import torch
import torch.nn.functional as F

from corpus import Registry, T

CASES = Registry("tensor_ops")
case = CASES
x34 = lambda: (T(3, 4),)
xy34 = lambda: (T(3, 4), T(3, 4))


@case(xy34)
def add_mul(x, y):
    return x + y * 2


@case(xy34)
def all_binary_operators(x, y):
    return x - y, x * y, x / (y.abs() + 1), x @ y.T, x ** 2, -x, +x, x // 1.5, x % 2.0


@case(xy34)
def comparisons(x, y):
    return x < y, x <= y, x > y, x >= y, x == y, x != y


@case(lambda: (T(3, 4, dtype=torch.int64), T(3, 4, dtype=torch.int64)))
def bitwise_ints(a, b):
    return a & b, a | b, a ^ b, ~a, a << 1, a >> 1


@case(x34)
def inplace_operators(x):
    y = x.clone()
    y += 1
    y *= 2
    y -= x
    y /= 3
    return y


@case(x34)
def torch_functions(x):
    return torch.sin(x), torch.exp(x), torch.tanh(x), torch.sigmoid(x), torch.abs(x), torch.clamp(x, -0.5, 0.5)


@case(x34)
def tensor_methods(x):
    return x.sin().cos(), x.exp().log(), x.relu(), x.softmax(-1), x.mean(), x.sum(1, keepdim=True)


@case(x34)
def reductions(x):
    return x.max(), x.min(dim=0).values, x.argmax(1), x.std(), x.var(0), x.prod(), x.norm()


@case(x34)
def max_with_dim_namedtuple(x):
    m = x.max(dim=1)
    return m.values * 2, m.indices, m[0]


@case(x34)
def views(x):
    return x.view(4, 3), x.reshape(-1), x.transpose(0, 1), x.permute(1, 0), x.unsqueeze(0), x.flatten(), x.T


@case(x34)
def view_with_shape_arithmetic(x):
    b, n = x.shape
    return x.view(b * n // 2, 2), x.reshape(x.size(0), -1, 2)


@case(x34)
def indexing(x):
    return x[0], x[:, 1], x[1:, ::2], x[None, ..., 0], x[-1, -1], x[[0, 2]]


@case(x34)
def setitem(x):
    y = x.clone()
    y[0] = 0.0
    y[:, 1] = y[:, 2] * 2
    return y


@case(x34)
def shape_properties(x):
    return x.shape[0] + x.size(1), x.dim(), x.ndim, x.numel(), len(x), x.dtype, x.device, x.is_contiguous()


@case(x34)
def dtype_conversions(x):
    return x.to(torch.float64), x.double(), x.half().float(), x.long(), x.int(), x.bool(), x.to(dtype=torch.bfloat16)


@case(x34)
def to_same_device(x):
    return x.to("cpu") + x.to(x.device), x.cpu() * 2


@case(x34)
def factories_like(x):
    return torch.zeros_like(x), torch.ones_like(x) + x, torch.full_like(x, 3.0), torch.empty_like(x).fill_(1.0)


@case(x34)
def factories_with_device(x):
    z = torch.zeros(3, 4, device=x.device, dtype=x.dtype)
    o = torch.ones(x.shape, dtype=torch.float64)
    r = torch.arange(4, device=x.device)
    return x + z, o, r * 2, torch.eye(3) @ x, torch.tensor([1.0, 2.0, 3.0, 4.0]) * x


@case(lambda: (T(2, 3), T(2, 3), T(2, 3)))
def cat_stack(a, b, c):
    return torch.cat([a, b, c], dim=0), torch.stack((a, b), dim=1), torch.cat([a, b], -1)


@case(lambda: (T(6, 4),))
def split_chunk(x):
    a, b = x.chunk(2)
    c, d, e = torch.split(x, 2)
    return a + b, c * d * e, x.unbind(0)[3]


@case(lambda: (T(2, 3, 4), T(2, 4, 5)))
def matmuls(a, b):
    return a @ b, torch.bmm(a, b), torch.matmul(a, b), torch.einsum("bij,bjk->bik", a, b)


@case(lambda: (T(4, 8), T(16, 8), T(16)))
def functional_linear(x, w, b):
    return F.linear(x, w, b), F.linear(x, w)


@case(x34)
def functional_activations(x):
    return F.relu(x), F.gelu(x), F.silu(x), F.softmax(x, dim=-1), F.log_softmax(x, 1), F.leaky_relu(x, 0.1), F.elu(x)


@case(lambda: (T(2, 5, 8), T(8), T(8)))
def functional_layer_norm(x, w, b):
    return F.layer_norm(x, (8,), w, b, 1e-5), F.normalize(x, dim=-1)


@case(lambda: (T(2, 3, 8, 8), T(4, 3, 3, 3)))
def functional_conv_pool(x, w):
    y = F.conv2d(x, w, padding=1)
    return F.max_pool2d(y, 2), F.avg_pool2d(y, 2), F.adaptive_avg_pool2d(y, 1)


@case(lambda: (T(2, 4, 6, 8), T(2, 4, 6, 8), T(2, 4, 6, 8)))
def scaled_dot_product_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@case(lambda: (T(4, 5), torch.randint(0, 5, (4,))))
def cross_entropy(logits, target):
    return F.cross_entropy(logits, target), F.nll_loss(F.log_softmax(logits, -1), target)


@case(lambda: (torch.randint(0, 10, (2, 5)), T(10, 4)))
def embedding(ids, table):
    return F.embedding(ids, table)


@case(x34)
def where_masked_fill(x):
    mask = x > 0
    return torch.where(mask, x, torch.zeros_like(x)), x.masked_fill(~mask, -1.0), torch.where(mask, x, 0.0)


@case(x34)
def math_on_constants(x):
    return x * math.sqrt(16) + math.pi, x / math.log(math.e ** 2)


@case(xy34)
def operator_module_on_tensors(x, y):
    return operator.add(x, y), operator.mul(x, 3), operator.neg(y), operator.getitem(x, 0)


@case(lambda: (T(3, 4, requires_grad=True),))
def requires_grad_flows(x):
    y = x * 2
    return y.sum(), y.requires_grad


@case(lambda: (T(3, 4, requires_grad=True),))
def no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    z = x * 3
    return y, z, y.requires_grad, z.requires_grad


@case(lambda: (T(3, 4, requires_grad=True),))
def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        a = x + 1
        with torch.enable_grad():
            b = x + 1
    return a.requires_grad, b.requires_grad, a, b


@case(lambda: (T(3, 4, requires_grad=True),))
def set_grad_enabled_block(x):
    with torch.set_grad_enabled(False):
        a = x * x
    return a, a.requires_grad


@case(x34)
def detach_contiguous_clone(x):
    return x.detach(), x.t().contiguous(), x.clone().add_(1)


@case(x34)
def new_tensor_methods(x):
    return x.new_zeros(2, 2), x.new_ones((3,)), x.new_full((2,), 7.0)


@case(lambda: (T(2, 3, 4),))
def expand_repeat_flip(x):
    return x[:, :1].expand(2, 3, 4), x.repeat(1, 2, 1), x.flip(0), torch.roll(x, 1, 2), x.tril(), x.triu(1)


@case(lambda: (T(5),))
def sort_topk_cumsum(x):
    return torch.sort(x).values, torch.topk(x, 2).values, torch.cumsum(x, 0), x.argsort()


@case(lambda: (T(3, 4), T(4)))
def broadcasting(x, b):
    return x + b, x * b[None], (x - b).pow(2).mean(-1)


@case(x34)
def float_literals_and_scalars(x):
    return x * 0.5 + 1, 2 - x, 1 / (x.abs() + 1), 2 ** x


@case(x34)
def torch_dtype_attributes(x):
    return x.to(torch.float64) * torch.finfo(x.dtype).eps, x.dtype.is_floating_point, x.is_floating_point()


@case(lambda: (T(3, 4), T(3, 4)))
def torch_tensor_class_methods(x, y):
    return torch.Tensor.add(x, y), torch.Tensor.relu(x)


@case(x34)
def type_as_and_to_other(x):
    y = torch.ones(3, 4, dtype=torch.float64)
    return x.type_as(y), x.to(y)


@case(lambda: (T(4, 4),))
def linalg_ops(x):
    return torch.linalg.norm(x), torch.linalg.vector_norm(x, dim=1), torch.trace(x)
