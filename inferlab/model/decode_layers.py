"""Every decoder layer of a decode step in one C call (``decode_layers.c``, beside this file: why).

:func:`run` takes the rows of a ragged batch of decodes, verifies and short prompts or chunks
(``inferlab.attention.paged.SHORT_PROMPT_MAX``: a continuous-batching step where a prompt joins
the running decodes), up to :data:`MAX_ROWS`, and runs all the layers over them in C: the same
RMSNorm, RoPE and paged attention loops as the per-operation path, and each linear's own loop
(``inferlab.quant.f32`` for float weights, ``inferlab.quant.vnni`` for the quantized formats). It returns False, and the model
runs its layers one module at a time, wherever one piece is not the stock one:

- a long prompt or chunk in the batch, more than :data:`MAX_ROWS` rows, autograd, a compiled step;
- a layer, norm, attention, MLP or linear that is not the class the model builds (a mixture of
  experts, a tensor-parallel shard, a lab's own module), or a linear without a C loop here;
- a hook on any of them (calibration and probes watch the modules run);
- an attention backend other than the torch one, a cache other than the float32 paged one;
- the loops switched off (``INFERLAB_QUANT_KERNEL``, ``ATEN_CPU_CAPABILITY=default``, no compiler).

The plan (pointers to every weight) is built once per model and loop settings and checked at each
call: a replaced module or tensor, or a tensor moved, rebuilds it.
"""
from __future__ import annotations

import ctypes
import operator
import weakref
from pathlib import Path

import torch
from torch import nn

from inferlab import native
from inferlab.loop_settings import settings
from inferlab.quant.base import version

SOURCE = Path(__file__).with_name("decode_layers.c")
DEPENDS = (Path(__file__).with_name("glue.c"), Path(__file__).parent.parent / "attention" / "cpu_decode.c",
           Path(__file__).parent.parent / "clones.h", Path(__file__).parent.parent / "exp_poly.h")
#: The most rows one call takes: 128 sequences each verifying k = 3 guesses, or a 512-token prompt
#: (``inferlab.attention.paged.SHORT_PROMPT_MAX``; more: the modules run, through the same loops,
#: so a row's bits are the same either way). smollm2 prefills 200-512 tokens here in 0.87-0.94x the
#: time of the modules with SDPA; at 1,000 tokens the row-by-row attention costs 1.03-1.05x.
MAX_ROWS = 512
_p, _i, _f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
SIG_P_I, SIG_PP_I, SIG_PPP_II, SIG_P_II = 0, 1, 2, 3


class _Linear(ctypes.Structure):
    _fields_ = [("fn", _p), ("p", _p * 3), ("bias", _p), ("sig", _i), ("n_out", _i), ("extra", _i)]


class _Layer(ctypes.Structure):
    _fields_ = [("ln1", _p), ("ln2", _p), ("qkv", _Linear * 3), ("o", _Linear), ("gate_up", _Linear * 2),
                ("down", _Linear), ("k_cache", _p), ("v_cache", _p), ("n_qkv", _i), ("n_gate_up", _i)]


class _Step(ctypes.Structure):
    _fields_ = [("M", _i), ("hidden", _i), ("hq", _i), ("hkv", _i), ("head_dim", _i), ("ffn", _i), ("S", _i),
                ("window", _i), ("nthreads", _i), ("eps", _f), ("scale", _f), ("cos", _p), ("sin", _p),
                ("slot_mapping", _p), ("slots", _p), ("row_len", _p)]


def _library():
    return native.library(SOURCE, (("inferlab_decode_layers", (_p, _p, _i, _p)),
                                   ("inferlab_run_linears", (_p, _p, _i, _p, _i, _p, _i))), DEPENDS)


class LinearsCall:
    """``modules`` (each with a C loop here, :func:`c_loop`) run one after the other over the first
    columns of x [M, widest input], in one C call: the products of a decode step without the
    Python of a module call between them. ``LinearsCall.of(modules)`` is None where a module has no
    loop here or the library does not build."""

    def __init__(self, lib, entries, widths, keep):
        self.lib, self.entries, self.widths, self._keep = lib, entries, widths, keep

    @classmethod
    def of(cls, modules) -> "LinearsCall | None":
        lib, found = _library(), [c_loop(m) for m in modules]
        if lib is None or not modules or any(f is None for f in found):
            return None
        entries, keep = (_Linear * len(modules))(), []
        for e, m, f in zip(entries, modules, found):
            keep += [*_fill(e, m, f), m.bias]
        return cls(lib, entries, (ctypes.c_int * len(modules))(*[m.in_features for m in modules]), keep)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """x [M, >= every input width] float32, y [M, >= every output width]: both contiguous."""
        if self.lib.inferlab_run_linears(self.entries, self.widths, len(self.entries), x.data_ptr(), x.shape[0],
                                         y.data_ptr(), torch.get_num_threads()):
            raise MemoryError("inferlab: a linear's loop could not allocate its buffers")


def _fill(entry: _Linear, module: nn.Module, found: tuple) -> tuple:
    """Point ``entry`` at ``module``'s loop (``found``: :func:`c_loop`'s answer) and its bias;
    returns the tensors the loop reads, which must outlive the entry."""
    entry.sig, entry.fn, tensors, entry.n_out, entry.extra = found
    for j, t in enumerate(tensors):
        entry.p[j] = t.data_ptr()
    entry.bias = None if module.bias is None else module.bias.data_ptr()
    return tensors


def _address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


def c_loop(module: nn.Module) -> tuple | None:
    """(signature, loop address, pointer tensors, N, extra int) of the C loop that computes
    ``module`` for a few rows here, or None: no loop takes it (the same conditions as the module's
    own forward, e.g. ``inferlab.quant.vnni.int8_linear``)."""
    from inferlab.model.linear import Linear
    from inferlab.quant import f32, vnni
    from inferlab.quant.ggml import GGMLLinear
    from inferlab.quant.int4 import Int4Linear
    from inferlab.quant.int8 import Int8Linear
    from inferlab.quant.nf4 import NF4_TABLE, NF4Linear
    kind, K = type(module), module.in_features
    if kind is Linear:
        w, loop = module.weight, f32.loop()
        if loop is None or w.dtype is not torch.float32 or not w.is_contiguous() or K % loop.width or w.shape[0] % 4:
            return None
        return SIG_P_I, _address(loop.function), (w,), w.shape[0], 0
    if kind not in (Int8Linear, Int4Linear, GGMLLinear, NF4Linear) or not vnni.available():
        return None
    q = module.qweight
    if kind is Int8Linear:
        ok = K % 32 == 0 and module.scales.dtype == torch.float16 and module.scales.is_contiguous()
        tiles = module.tiles()  # in tiles of 16 outputs, where that loop runs
        spec = SIG_PP_I, "int8" if tiles is None else "int8_tiles", (q if tiles is None else tiles, module.scales), \
            q.shape[0], 0
    elif kind is Int4Linear:
        g = module.group_size
        ok = (module.perm is None and g % 64 == 0 and module.scales.dtype == torch.float16
              and module.zeros.dtype == torch.uint8 and module.scales.is_contiguous() and module.zeros.is_contiguous())
        tiles = module.tiles()  # in tiles of 16 outputs, where that loop runs
        spec = (SIG_PPP_II, "int4", (q, module.scales, module.zeros), q.shape[0], g) if tiles is None else \
            (SIG_P_II, "int4_tiles", (tiles,), q.shape[0], g)
    elif kind is GGMLLinear:
        ok = module.ggml_type in vnni.BLOCK_TYPES
        tiles = module.tiles()  # Q8_0/Q4_0/Q4_1 in tiles of 16 outputs, where that loop runs
        spec = (SIG_P_I, module.ggml_type, (q,), q.shape[0], 0) if tiles is None else \
            (SIG_P_I, f"{module.ggml_type}_tiles", (tiles,), q.shape[0], 0)
    else:
        b = module.blocksize
        ok = b % 32 == 0 and K % b == 0 and module.absmax.dtype == torch.float32
        tiles = module.tiles()  # in tiles of 16 outputs, where that loop runs
        spec = (SIG_PPP_II, "nf4", (q, module.absmax, NF4_TABLE), module.out_features, b) if tiles is None else \
            (SIG_P_II, "nf4_tiles", (tiles,), module.out_features, b)
    if not (ok and q.is_cpu and q.is_contiguous()):
        return None
    sig, name, tensors, n, extra = spec
    args = (*tensors, n, extra) if sig in (SIG_PPP_II, SIG_P_II) else (*tensors, n)
    return sig, _address(vnni._function(name, args)), tensors, n, extra


class _Plan:
    """The ctypes description of every layer, and what it was built from (to check it still holds)."""

    def __init__(self, model, cache, stock: tuple):
        from inferlab.attention import TorchSDPABackend
        from inferlab.model.packing import use_packed
        decoder_layer, attention, mlp_class, rms_norm = stock
        cfg = model.config
        self.layers = (_Layer * cfg.num_hidden_layers)()
        self.watched: list[tuple[dict, str, object]] = []  # (dict, key, value) that must still hold
        self.tensors: list[tuple[torch.Tensor, int]] = []  # (tensor, data_ptr) that must not move
        self.hook_dicts: list[dict] = []
        self.versions: list[tuple[torch.Tensor, int]] = []  # (tensor, version) whose copy the loops read
        self.classes: list[tuple[nn.Module, type]] = []  # (module, the class the plan found)
        self.cache = cache
        self._cache_columns = ((), ())  # the cache's tensors and their addresses (point_at swaps them)
        self._columns = None  # holds()'s checks as columns, built at its first call
        self.ok = cfg.head_dim % 16 == 0 and cfg.head_dim <= 256  # what cpu_decode.c's attention takes
        if not self.ok:
            return
        for i, layer in enumerate(model.model.layers):
            attn, mlp = layer.__dict__["_modules"].get("self_attn"), layer.__dict__["_modules"].get("mlp")
            norms = layer.input_layernorm, layer.post_attention_layernorm
            if not (type(layer) is decoder_layer and type(attn) is attention and type(mlp) is mlp_class
                    and all(type(n) is rms_norm and n.weight.dtype is torch.float32 for n in norms)
                    and type(attn.backend) is TorchSDPABackend
                    and (attn.n_heads, attn.n_kv) == (cfg.num_attention_heads, cfg.num_key_value_heads)):
                self.ok = False
                return
            self.watched.append((model.model.layers._modules, str(i), layer))
            for owner in (layer, attn, mlp):
                self.watched += [(owner._modules, k, v) for k, v in owner._modules.items()]
            self.watched.append((attn.__dict__, "backend", attn.backend))
            for n in norms:
                self._tensor(n, "weight")
            entry = self.layers[i]
            entry.ln1, entry.ln2 = norms[0].weight.data_ptr(), norms[1].weight.data_ptr()
            qkv = use_packed(attn, "packed_qkv", attn.q_proj, attn.k_proj, attn.v_proj)
            gate_up = use_packed(mlp, "packed_gate_up", mlp.gate_proj, mlp.up_proj)
            self.watched += [(attn.__dict__, "packed_qkv", qkv), (mlp.__dict__, "packed_gate_up", gate_up)]
            parts = ([qkv.fused] if qkv else [attn.q_proj, attn.k_proj, attn.v_proj],
                     [gate_up.fused] if gate_up else [mlp.gate_proj, mlp.up_proj])
            entry.n_qkv, entry.n_gate_up = len(parts[0]), len(parts[1])
            for j, m in enumerate(parts[0]):
                self._linear(m, entry.qkv[j])
            for j, m in enumerate(parts[1]):
                self._linear(m, entry.gate_up[j])
            self._linear(attn.o_proj, entry.o)
            self._linear(mlp.down_proj, entry.down)
            linears = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj
            for mod in linears:  # a packed part's rows view the packed tensor: watch the parts too
                self._tensors(mod)
            for mod in (layer, attn, mlp, *norms, *linears):
                self.hook_dicts += [mod._forward_hooks, mod._forward_pre_hooks]
                self.classes.append((mod, type(mod)))  # a module given another class (a lab's probe) runs as such
            if not self.ok:
                return
        self._use_cache(cache)

    def _tensor(self, module: nn.Module, name: str) -> torch.Tensor:
        store = module._parameters if name in module._parameters else module._buffers
        t = store[name]
        self.watched.append((store, name, t))
        self.tensors.append((t, t.data_ptr()))
        return t

    def _tensors(self, module: nn.Module) -> None:
        for name in (*module._parameters, *module._buffers):
            if getattr(module, name) is not None:
                self._tensor(module, name)

    def _linear(self, module: nn.Module, entry: _Linear) -> None:
        found = c_loop(module)
        if found is None:
            self.ok = False
            return
        tensors = _fill(entry, module, found)
        self._tensors(module)
        if tensors[0] is not getattr(module, "qweight", tensors[0]):
            # the loop reads a copy (tiles) of the module's buffers: a change made to one in place must rebuild it
            self.versions += [(t, version(t)) for t in module.buffers(recurse=False)]
        bias = module.bias
        if bias is not None and (bias.dtype is not torch.float32 or not bias.is_contiguous()):
            self.ok = False

    def point_at(self, cache) -> bool:
        """Re-point the layers at another KV cache laid out as this one (another engine over the
        same weights: a benchmark's runs side by side, one step each in turn), keeping the rest of
        the plan, which took ~3 ms to build on smollm2; False where the layout differs."""
        old = self.cache
        if (len(cache.k_slots) != len(old.k_slots) or cache.k.dtype != old.k.dtype
                or cache.k_slots[0].shape[1:] != old.k_slots[0].shape[1:]):
            return False
        self._use_cache(cache)
        return True

    def _use_cache(self, cache) -> None:
        """Each layer's K/V pointers into ``cache``, and the addresses holds() checks."""
        for entry, k, v in zip(self.layers, cache.k_slots, cache.v_slots):
            entry.k_cache, entry.v_cache = k.data_ptr(), v.data_ptr()
        self._cache_columns = _unzip([(t, t.data_ptr()) for t in (*cache.k_slots, *cache.v_slots)], 2)
        self.cache = cache

    def holds(self, cache) -> bool:
        """Is every module, tensor and pointer the plan was built from still in place? Asked at
        every forward, about a thousand checks for a 30-layer model: they run as ``map`` over
        columns built once, about 5x faster than a Python loop (tens of microseconds a step)."""
        if cache is not self.cache:
            return False
        if self._columns is None:
            live = [(t, v) for t, v in self.versions if not t.is_inference()]  # an inference tensor stays -1
            self._columns = (*_unzip(self.watched, 3), *_unzip(self.tensors, 2), *_unzip(live, 2),
                             *_unzip(self.classes, 2))
        dicts, keys, values, tensors, ptrs, counted, counts, modules, classes = self._columns
        return (all(map(operator.eq, map(torch.Tensor.data_ptr, self._cache_columns[0]), self._cache_columns[1]))
                and all(map(operator.is_, map(type, modules), classes))
                and all(map(operator.is_, map(dict.get, dicts, keys), values))
                and all(map(operator.eq, map(torch.Tensor.data_ptr, tensors), ptrs))
                and all(map(operator.eq, map(_VERSION, counted), counts)))


def _unzip(rows: list[tuple], width: int) -> tuple:
    """[(a, b), ...] -> ((a, ...), (b, ...)); empty columns for no rows."""
    return tuple(zip(*rows)) if rows else ((),) * width


_VERSION = operator.attrgetter("_version")


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {loop settings: plan}; not in the
# model itself, which deepcopy and pickle must still copy


def _plan(model, cache, stock: tuple) -> _Plan | None:
    from inferlab.model.packing import _global_hooks
    if _global_hooks():
        return None
    key = settings()
    plans = _PLANS.setdefault(model, {})
    plan = plans.get(key)
    if plan is not None and plan.ok and plan.cache is not cache:
        plan.point_at(cache)
    if plan is None or not plan.holds(cache):
        plans[key] = plan = _Plan(model, cache, stock)
    return plan if plan.ok and not any(plan.hook_dicts) else None  # a hook must see its module run


def run(model, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta, stock: tuple) -> bool:
    """Run ``model``'s layers over x [1, N, hidden] in place in one C call; False (x untouched):
    the caller runs them module by module. ``stock``: the classes of ``inferlab.model.llama``
    (decoder layer, attention, MLP, RMSNorm) whose arithmetic the C file repeats."""
    from inferlab.attention.paged import PagedAttentionMetadata
    from inferlab.cache.paged import PagedKVCache
    if not isinstance(meta, PagedAttentionMetadata) or torch.is_grad_enabled():
        return False
    n, b = x.shape[1], len(meta.query_lens)
    d, m = meta.num_decodes, meta.num_multi_query
    cache = meta.kv_cache
    if not (0 < n <= MAX_ROWS and d + m == b and type(cache) is PagedKVCache and cache.k.dtype is torch.float32
            and x.is_contiguous() and native.runs(x)) or (lib := _library()) is None:
        return False
    plan = _plan(model, cache, stock)
    if plan is None:
        return False
    row_slots, row_len, s = _rows(meta)
    cfg = model.config
    cos, sin = cos.contiguous(), sin.contiguous()
    slot_mapping = meta.slot_mapping.to(torch.int64).contiguous()
    step = _Step(M=n, hidden=cfg.hidden_size, hq=cfg.num_attention_heads, hkv=cfg.num_key_value_heads,
                 head_dim=cfg.head_dim, ffn=cfg.intermediate_size, S=s, window=cfg.sliding_window or 0,
                 nthreads=torch.get_num_threads(), eps=cfg.rms_norm_eps, scale=cfg.head_dim ** -0.5,
                 cos=cos.data_ptr(), sin=sin.data_ptr(), slot_mapping=slot_mapping.data_ptr(),
                 slots=row_slots.data_ptr(), row_len=row_len.data_ptr())
    if lib.inferlab_decode_layers(x.data_ptr(), plan.layers, len(plan.layers), ctypes.byref(step)):
        raise MemoryError("inferlab: the decode layers could not allocate their buffers")
    return True


def _rows(meta) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Each row's readable slots [N, S] and how many positions it sees [N] (int64), and S: a decode
    row sees its whole context, the i-th of a sequence's q rows over c tokens sees c - q + i + 1."""
    d, lens, ctx = meta.num_decodes, meta.query_lens, meta.context_lens_host
    if d == len(lens):  # decodes only: build_masks laid their slots out already
        slots = meta.decode_slots.to(torch.int64).contiguous()
        return slots, meta.context_lens[:d].to(torch.int64).contiguous(), slots.shape[1]
    if d == 0:  # verifies only: build_masks laid their rows out for the per-module path's C loop
        layout = meta.multi_query
        return layout["row_slots"], layout["row_lens"], layout["row_slots"].shape[1]
    s, bs = max(ctx), meta.kv_cache.block_size
    nb = -(-s // bs)
    seq_slots = (meta.block_tables[:, :nb, None] * bs + torch.arange(bs)).view(len(lens), nb * bs)[:, :s]
    seq_of_row, row_len = [], []
    for j, (q, c) in enumerate(zip(lens, ctx)):
        seq_of_row += [j] * q
        row_len += range(c - q + 1, c + 1)
    rows = seq_slots.index_select(0, torch.tensor(seq_of_row)).to(torch.int64).contiguous()
    return rows, torch.tensor(row_len, dtype=torch.int64), s
