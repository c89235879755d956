"""Lowerings: views (index rewrites, no data moved) and data movement: cat, pad, gather, embedding, index,
index_put of a few positions (part of core.py's tables; accumulating scatters are in scatter.py)."""

import torch

from brrr.compile.ir import nodes as ir
from brrr.compile.ir.indexing import Ix, Term, contiguous_strides, linear, unflatten
from brrr.compile.ir.nodes import Const, IndexValue, Op
from brrr.compile.ir.sizes import same
from brrr.compile.lowering.core import (NotLowered, cast, check_index_input, fake, ge, indirect, lt, masked, meta,
                                        op_name, pw, register, register_prim, value_of, view_node, wrap_negative)
from brrr.compile.scheduling import layout


# ----------------------------------------------------------------------------------------------- views

@register("view", "_unsafe_view", "reshape", "view_as", "alias", "detach", "lift_fresh", "clone_view")
def lower_view(L, fx, x, *rest):
    m = meta(fx)
    shape = tuple(m.shape)
    if same(x.shape, shape):
        return view_node(L, fx, x, lambda idx: x(idx))
    src_shape = tuple(x.shape)
    strides = contiguous_strides(shape)
    return view_node(L, fx, x, lambda idx: x(unflatten(linear(idx, strides), src_shape)))


@register("permute")
def lower_permute(L, fx, x, dims):
    dims = [d % max(len(x.shape), 1) for d in dims]

    def fn(idx):
        src = [None] * len(dims)
        for out_d, in_d in enumerate(dims):
            src[in_d] = idx[out_d]
        return x(src)
    return view_node(L, fx, x, fn)


@register("transpose", "t")
def lower_transpose(L, fx, x, d0=0, d1=1):
    n = len(x.shape)
    if n < 2:
        return view_node(L, fx, x, lambda idx: x(idx))
    d0, d1 = d0 % n, d1 % n

    def fn(idx):
        idx = list(idx)
        idx[d0], idx[d1] = idx[d1], idx[d0]
        return x(idx)
    return view_node(L, fx, x, fn)


@register("expand", "expand_as", "broadcast_to")
def lower_expand(L, fx, x, *rest):
    shape = tuple(meta(fx).shape)
    return view_node(L, fx, x, lambda idx: value_of(x, idx, shape))


@register("slice")
def lower_slice(L, fx, x, dim=0, start=None, end=None, step=1):
    n = len(x.shape)
    dim %= n
    size = x.shape[dim]
    start = 0 if start is None else start
    start = max(0, min(size, start + size if start < 0 else start))

    def fn(idx):
        idx = list(idx)
        idx[dim] = Ix.of(idx[dim]) * step + start
        return x(idx)
    return view_node(L, fx, x, fn)


@register("split_with_sizes", "split", "unbind", "chunk", "tensor_split")
def lower_split(L, fx, x, *args, **kw):
    """several views at once: each output is a slice (unbind: a select) of x."""
    vals = meta(fx)
    name = op_name(fx.target)
    dim = (args[0] if args else kw.get("dim", 0)) if name == "unbind" else (args[1] if len(args) > 1 else kw.get("dim", 0))
    dim %= len(x.shape)
    outs, start = [], 0
    for i, v in enumerate(vals):
        size = 1 if name == "unbind" else v.shape[dim]
        s0 = start

        def fn(idx, s0=s0):
            idx = list(idx)
            if name == "unbind":
                idx.insert(dim, Ix.of(s0))
            else:
                idx[dim] = Ix.of(idx[dim]) + s0
            return x(idx)
        node = ir.pointwise(L.fresh("view"), tuple(v.shape), v.dtype, fn, fx=fx, ops=(name,), view_of=x)
        node.meta["out_index"] = i
        node.meta["fake"] = v
        outs.append(node)
        start += size
    return tuple(outs)


@register("select")
def lower_select(L, fx, x, dim, index):
    dim %= len(x.shape)
    index = index + x.shape[dim] if index < 0 else index
    return view_node(L, fx, x, lambda idx: x(list(idx[:dim]) + [Ix.of(index)] + list(idx[dim:])))


@register("squeeze", "unsqueeze")
def lower_squeeze(L, fx, x, *rest):
    shape = tuple(meta(fx).shape)
    keep = [i for i, s in enumerate(shape) if s != 1]
    src_keep = [i for i, s in enumerate(x.shape) if s != 1]

    def fn(idx):
        src = [Ix()] * len(x.shape)
        for i, j in zip(src_keep, keep):
            src[i] = idx[j]
        return x(src)
    return view_node(L, fx, x, fn)


@register("diagonal")
def lower_diagonal(L, fx, x, offset=0, dim1=0, dim2=1):
    """out[..., i] = x[..., i, i + offset] with dims dim1, dim2 taken out and the diagonal appended last."""
    n = len(x.shape)
    dim1, dim2 = dim1 % n, dim2 % n
    rest = [d for d in range(n) if d not in (dim1, dim2)]

    def fn(idx):
        src = [None] * n
        for d, i in zip(rest, idx[:-1]):
            src[d] = i
        i = Ix.of(idx[-1])
        src[dim1], src[dim2] = (i, i + offset) if offset >= 0 else (i + (-offset), i)
        return x(src)
    return view_node(L, fx, x, fn)


@register("as_strided")
def lower_as_strided(L, fx, x, size, stride, offset=None):
    """as_strided addresses its input's storage, not the input: an index rewrite only where brrr knows where
    that storage starts. A graph input's storage offset is the caller's (an autograd tangent's differs from the
    traced one), so its as_strided runs as the ATen view it is."""
    f = fake(x)
    if x.kind == "buffer" and x.producer == "input":
        node = L.buffer_op(fx, "extern", "")
        L.added.add(node)
        return node
    offset = f.storage_offset() if offset is None else offset
    if x.kind != "buffer":
        if tuple(f.stride()) != contiguous_strides(f.shape) or f.storage_offset() != 0:
            raise NotLowered("as_strided over a non-contiguous intermediate or a view of one")
        if any(s < 0 for s in stride) or offset + sum((n - 1) * s for n, s in zip(size, stride) if n) >= max(x.numel, 1):
            raise NotLowered("as_strided reaching outside its input")
    if x.kind == "buffer":   # relative to the tensor's data_ptr(), which already includes its storage offset
        offset -= f.storage_offset()
        return view_node(L, fx, x, lambda idx: ir.Load(x, linear(idx, stride, offset), x.dtype,
                                                      mask=ir.MASKS[-1] if ir.MASKS else None))
    return view_node(L, fx, x, lambda idx: x(unflatten(linear(idx, stride, offset), tuple(x.shape))))


@register("as_strided_scatter")
def lower_as_strided_scatter(L, fx, base, src, size, stride, storage_offset=None):
    """The view covers a contiguous base exactly, each element once (functionalized adaptive pooling's
    backward writes a gradient through such a view of zeros): the result is src read through the view's
    inverse, a permutation of the flat index."""
    f = fake(base)
    size, stride = tuple(size), tuple(stride)
    order = layout.order_of(stride, size)
    numel = 1
    for s in size:
        numel *= s
    if not (tuple(f.stride()) == contiguous_strides(f.shape) and f.storage_offset() == 0 and not storage_offset
            and numel == base.numel and tuple(src.shape) == size
            and tuple(s for d, s in enumerate(stride) if size[d] != 1) ==
            tuple(s for d, s in enumerate(layout.dense_strides(size, order)) if size[d] != 1)):
        raise NotLowered("as_strided_scatter other than through a view that covers a contiguous base once")
    strides = contiguous_strides(base.shape)
    out = meta(fx).dtype
    return pw(L, fx, lambda idx: cast(src(unflatten(linear(idx, strides), size, order)), out))


# ------------------------------------------------------------------------------- cat / pad / gather

@register("cat")
def lower_cat(L, fx, tensors, dim=0):
    m = meta(fx)
    dim %= len(m.shape)
    parts = [t for t in tensors if isinstance(t, ir.Node) and t.numel > 0]
    out = m.dtype

    def fn(idx):
        offs, acc = [], 0
        for t in parts:
            offs.append(acc)
            acc += t.shape[dim]
        v = None
        for t, off in reversed(list(zip(parts, offs))):
            sub = list(idx)
            sub[dim] = Ix.of(idx[dim]) + (-off) if off else idx[dim]
            if v is None:
                v = cast(t(sub), out) if off == 0 else masked(ge(idx[dim], off), lambda: cast(t(sub), out))
            else:
                # the where-chain picks part i when idx < end_i, but its loads need both bounds: part i read
                # at idx < off_i is a negative index (an illegal address on the GPU, GPT-2's qkv backward)
                upper = lt(idx[dim], off + t.shape[dim])
                inside = upper if off == 0 else Op("and", [ge(idx[dim], off), upper], torch.bool)
                v = Op("where", [upper, masked(inside, lambda: cast(t(sub), out)), v], out)
        return v
    return pw(L, fx, fn)


@register("constant_pad_nd")
def lower_pad(L, fx, x, pad, value=0):
    m = meta(fx)
    n = len(m.shape)
    out = m.dtype

    def fn(idx):
        sub, conds = list(idx), []
        for i in range(len(pad) // 2):
            d = n - 1 - i
            lo = pad[2 * i]
            sub[d] = Ix.of(idx[d]) + (-lo)
            if lo > 0:
                conds.append(ge(idx[d], lo))
            if lo + x.shape[d] < m.shape[d]:
                conds.append(lt(idx[d], lo + x.shape[d]))
        if not conds:
            return cast(x(sub), out)
        cond = conds[0]
        for c in conds[1:]:
            cond = Op("and", [cond, c], torch.bool)
        return Op("where", [cond, masked(cond, lambda: cast(x(sub), out)), Const(value, out)], out)
    return pw(L, fx, fn)


@register("embedding")
def lower_embedding(L, fx, weight, indices, *rest):
    check_index_input(L, indices, weight.shape[0], "embedding")
    k = len(indices.shape)
    return pw(L, fx, lambda idx: weight([indirect(indices(idx[:k]))] + list(idx[k:])))


def _read_along(L, fx, x, dim, index, op, index_at):
    """x with dim `dim` read at index[index_at(idx)]: index_select and gather."""
    dim %= max(len(x.shape), 1)
    if len(x.shape):
        check_index_input(L, index, x.shape[dim], op)

    def fn(idx):
        src = list(idx)
        if len(x.shape):
            src[dim] = indirect(index(index_at(idx, dim)))
        return x(src)
    return pw(L, fx, fn)


@register("index_select")
def lower_index_select(L, fx, x, dim, index):
    return _read_along(L, fx, x, dim, index, "index_select", lambda idx, d: [idx[d]] if index.shape else [])


@register("gather")
def lower_gather(L, fx, x, dim, index, sparse_grad=False):
    return _read_along(L, fx, x, dim, index, "gather", lambda idx, d: idx)


@register("index")
def lower_index(L, fx, x, indices):
    """x[..., i0, i1, ...] with integer index tensors, as NumPy's advanced indexing: the index tensors broadcast
    against each other (a [B, 1, 1, 1] batch index beside a [1, 1, S, 1] position index builds a [B, 1, S, 1] mask
    gather, as Hugging Face's mask functions do), and their broadcast shape takes the place of the indexed dims
    where those are adjacent (`x[:, :, rows, cols]`: bilinear upsampling's gathers), else leads the result. Dims
    without an index (None, or past the last index) are read whole. Boolean masks fall back."""
    indices = list(indices) + [None] * (len(x.shape) - len(indices))
    indexed = [d for d, i in enumerate(indices) if i is not None]
    if not indexed or any(indices[d].dtype == torch.bool for d in indexed):
        raise NotLowered("advanced indexing by a boolean mask")
    try:
        shape = tuple(torch.broadcast_shapes(*[tuple(indices[d].shape) for d in indexed]))
    except RuntimeError:
        raise NotLowered("index tensors that do not broadcast") from None
    k = len(shape)
    for d in indexed:
        check_index_input(L, indices[d], x.shape[d], "index", negative_ok=True)
    # NumPy's rule: adjacent index tensors put their dims where they stand, separated ones put them first
    first = indexed[0] if indexed == list(range(indexed[0], indexed[-1] + 1)) else 0

    def at(i, idx):
        """Index tensor `i` at the broadcast index `idx` (its dims right-aligned; a size-1 dim reads 0)."""
        off = k - len(i.shape)
        return i([Ix() if i.shape[d] == 1 else idx[off + d] for d in range(len(i.shape))])

    def fn(idx):
        gathered, whole = idx[first:first + k], iter(list(idx[:first]) + list(idx[first + k:]))
        src = [indirect(wrap_negative(cast(at(i, gathered), torch.int64), x.shape[d])) if i is not None
               else next(whole) for d, i in enumerate(indices)]
        return x(src)
    return pw(L, fx, fn)


@register_prim("broadcast_in_dim")
def prim_broadcast_in_dim(L, fx, x, shape, bdims):
    def fn(idx):
        return x([Ix() if x.shape[i] == 1 else idx[d] for i, d in enumerate(bdims)])
    return view_node(L, fx, x, fn)




@register("flip")
def lower_flip(L, fx, x, dims):
    """out[i] = x[size - 1 - i] on the flipped dims; the reversed index stays an opaque non-negative base. A
    pointwise node, not a view: ATen's flip copies, and no strides express it."""
    n = len(x.shape)
    dims = {d % n for d in dims} if n else set()

    def fn(idx):
        src = list(idx)
        for d in dims:
            size = x.shape[d]
            i = Ix.of(idx[d])
            if size <= 1:
                continue
            if any(not isinstance(b, str) for b in i.bases()):
                raise NotLowered("flip of an indirect index")
            src[d] = Ix([Term(f"({size - 1} - ({i.render()}))", size, 1, None, 1)])
        return x(src)
    return pw(L, fx, fn)


def _scatter_into(L, fx, x, src, inside, src_index):
    """out = x where `inside(idx)` holds, else src at `src_index(idx)` (read only where inside holds)."""
    out = meta(fx).dtype

    def fn(idx):
        cond = inside(idx)
        new = masked(cond, lambda: cast(src(src_index(idx)), out))
        return Op("where", [cond, new, cast(x(idx), out)], out)
    return pw(L, fx, fn)


def _all(conds):
    cond = conds[0]
    for c in conds[1:]:
        cond = Op("and", [cond, c], torch.bool)
    return cond


@register("slice_scatter")
def lower_slice_scatter(L, fx, x, src, dim=0, start=None, end=None, step=1):
    """x with x[start:end:step] along `dim` replaced by src."""
    dim %= len(x.shape)
    size = x.shape[dim]
    start = 0 if start is None else start + size if start < 0 else start
    end = size if end is None else end + size if end < 0 else end
    start, end = max(0, min(size, start)), max(0, min(size, end))
    shift = (-start) % step          # i + shift = i - start (mod step), and both are >= 0 where it matters
    first = (start + shift) // step

    def inside(idx):
        conds = [ge(idx[dim], start), lt(idx[dim], end)]
        if step != 1:
            conds.append(Op("eq", [IndexValue((Ix.of(idx[dim]) + shift) % step), Const(0, torch.int64)],
                            torch.bool))
        return _all(conds)

    def src_index(idx):
        sub = list(idx)
        sub[dim] = (Ix.of(idx[dim]) + shift) // step + (-first) if step != 1 else Ix.of(idx[dim]) + (-start)
        return sub
    return _scatter_into(L, fx, x, src, inside, src_index)


@register("select_scatter")
def lower_select_scatter(L, fx, x, src, dim, index):
    """x with x.select(dim, index) replaced by src."""
    dim %= len(x.shape)
    index = index + x.shape[dim] if index < 0 else index
    return _scatter_into(L, fx, x, src, lambda idx: Op("eq", [IndexValue(idx[dim]), Const(index, torch.int64)],
                                                              torch.bool),
                         lambda idx: list(idx[:dim]) + list(idx[dim + 1:]))


@register("diagonal_scatter")
def lower_diagonal_scatter(L, fx, x, src, offset=0, dim1=0, dim2=1):
    """x with x.diagonal(offset, dim1, dim2) replaced by src (its diagonal index last)."""
    n = len(x.shape)
    dim1, dim2 = dim1 % n, dim2 % n
    rest = [d for d in range(n) if d not in (dim1, dim2)]

    def inside(idx):
        return Op("eq", [IndexValue(Ix.of(idx[dim2])), IndexValue(Ix.of(idx[dim1]) + offset)], torch.bool)

    def src_index(idx):
        return [idx[d] for d in rest] + [idx[dim1] if offset >= 0 else idx[dim2]]
    return _scatter_into(L, fx, x, src, inside, src_index)


@register("repeat")
def lower_repeat(L, fx, x, repeats):
    """out[..., j] = x[..., j % size]: x aligned with the trailing dims of the output."""
    shape = tuple(meta(fx).shape)
    lead = len(shape) - len(x.shape)
    return pw(L, fx, lambda idx: x([Ix.of(i) % s for i, s in zip(idx[lead:], x.shape)]))


MAX_PUT_POSITIONS = 16   # index_put positions a written element is compared with, one `where` each


def index_put_few(L, fx, x, indices, values):
    """out = x; out[..., i[p], ...] = values[..., p, ...] for one integer index tensor of at most
    MAX_PUT_POSITIONS elements on one dim (a static KV cache's write of the new tokens: `index_copy_` along the
    sequence dim). One pointwise kernel over x: each element compares its index along that dim with every
    position; where positions repeat, the last wins, as a sequential write would."""
    dims = [d for d, i in enumerate(indices) if i is not None]
    if len(dims) != 1 or indices[dims[0]].dtype == torch.bool:
        raise NotLowered("index_put other than accumulate=True with one integer index tensor")
    d = dims[0]
    index = indices[d]
    if len(index.shape) != 1 or index.numel > MAX_PUT_POSITIONS:
        raise NotLowered(f"index_put of more than {MAX_PUT_POSITIONS} positions without accumulate")
    check_index_input(L, index, x.shape[d], "index_put", negative_ok=True)
    positions = index.numel
    full = tuple(x.shape[:d]) + (positions,) + tuple(x.shape[d + 1:])   # what values broadcast to
    out = meta(fx).dtype

    def value_at(idx, p):
        at = list(idx)
        at[d] = Ix.of(p)
        if not isinstance(values, ir.Node):
            return Const(values, out)
        off = len(full) - len(values.shape)
        return values([Ix() if values.shape[j] == 1 else at[off + j] for j in range(len(values.shape))])

    def fn(idx):
        result = cast(x(idx), out)
        for p in range(positions):
            where = wrap_negative(cast(index([Ix.of(p)]), torch.int64), x.shape[d])
            hit = Op("eq", [where, IndexValue(idx[d])], torch.bool)
            new = masked(hit, lambda p=p: cast(value_at(idx, p), out))
            result = Op("where", [hit, new, result], out)
        return result
    return pw(L, fx, fn)
