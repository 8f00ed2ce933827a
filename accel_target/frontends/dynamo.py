"""TorchDynamo backend "accel": ``torch.compile(model, backend="accel", options={...})``.

PyTorch finds it through the ``torch_dynamo_backends`` entry point (setup.py): the name is
listed when torch looks up any backend, and this module (with accel_target and TVM) is
imported only where ``backend="accel"`` is asked for.

Per FX graph that dynamo hands over:

1. `_plan`: its placeholders sorted into constants (parameters, buffers and module floats such
   as a LayerNorm's eps: dynamo passes them as graph inputs), sizes (SymInts: a size of a
   tensor input) and tensor inputs; the inputs' layouts as they arrive, the outputs' as eager
   returns them (their fake tensors' strides).
2. `_closed_graph`: the graph with only the tensor inputs left: constants as buffers
   (torch.export lifts them, TVM's importer binds them: folded and packed at build time), a
   module float's ``.item()`` as its number, a SymInt as ``sym_size`` of its input.
3. `_build`: torch.export with one Dim per dynamo symbol (``dynamic=True`` / ``mark_dynamic``:
   one build for every size), accel's `import_program` and `accel_target.build`, through the
   disk cache (accel_target/frontends/dynamo_cache.py).
4. `_runner`: the function dynamo calls: torch tensors in and out through DLPack; a
   channels-last input passed as its NHWC memory (no copy), an NHWC output returned as a
   channels-last NCHW view, as eager returns it.

Whatever fails in 1-3 (an op TVM cannot import, a program that mutates, a build error)
leaves the graph to PyTorch (``gm.forward``) with one AccelFallbackWarning naming the op and
the reason; ``options={"fallback": "raise"}`` raises instead. Graph breaks are dynamo's: each
graph is built, or left to PyTorch, on its own.

Weights are folded at compile time but dynamo does not guard their values: it calls one graph
with the weights of every instance of a module (each layer, where graph breaks cut the model at
its layers). Each set of weight tensors gets a build of its own, on the first call with it
(`_WeightSets`); a set changed in place since (``load_state_dict``, an optimizer step) runs in
PyTorch from then on, with a warning to call ``torch.compiler.reset()``. accel is inference
only: a graph traced with grad mode on and an input or parameter that requires grad runs in
PyTorch.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import warnings

import torch

from . import dynamo_cache

OPTIONS = {
    "input_layout": "auto",  # "auto": "NHWC" iff every 4-D input arrives channels-last; None; "NHWC"
    "output_layout": "auto",  # "auto": "NHWC" iff eager returns every 4-D output channels-last; None; "NHWC"
    "strict": None,  # accel_target.build(strict=...): a fallback to TVM's kernel is an error
    "tuning_db": None,  # accel_target.build(tuning_db=...)
    "cache_dir": None,  # None: $ACCEL_CACHE_DIR, else $XDG_CACHE_HOME/accel_target/dynamo
    "fallback": "warn",  # "warn": run the graph in PyTorch with a warning; "raise": raise
}
STATS = collections.Counter()  # this process's "compiles", "builds", "cache_hits", "fallbacks"
_WARNED: set[str] = set()


class AccelFallbackWarning(UserWarning):
    """A graph runs in PyTorch instead of accel (the message says which op and why)."""


class _Unsupported(Exception):
    """A graph this backend does not take (the message is the reason)."""


@dataclasses.dataclass
class _Plan:
    kinds: list = dataclasses.field(default_factory=list)  # per placeholder: input|const|scalar|checked|sym
    consts: dict = dataclasses.field(default_factory=dict)  # placeholder index -> tensor or number
    originals: dict = dataclasses.field(default_factory=dict)  # index -> the parameter as dynamo passes it
    names: list = dataclasses.field(default_factory=list)  # placeholder names
    inputs: list = dataclasses.field(default_factory=list)  # placeholder indices of the tensor inputs
    fakes: list = dataclasses.field(default_factory=list)  # per tensor input: its (symbolic) fake tensor
    syms: dict = dataclasses.field(default_factory=dict)  # index of a SymInt -> (input, dim)
    shapes: list = dataclasses.field(default_factory=list)  # per tensor input: ints and sympy symbols
    shape_env: object = None
    input_cl: list = dataclasses.field(default_factory=list)  # per tensor input: channels-last?
    output_cl: list = dataclasses.field(default_factory=list)  # per output: channels-last in eager?
    output_4d: list = dataclasses.field(default_factory=list)
    output_fixed: list = dataclasses.field(default_factory=list)  # per output: of weights alone?
    single: bool = False  # the graph returns one value, not a tuple


def _from_module(node) -> bool:
    """The placeholder holds something read from an nn.Module (parameter, buffer, float attribute)."""
    source = getattr(node, "_dynamo_source", None)
    if source is None and "grapharg" in node.meta:
        source = node.meta["grapharg"].source
    if source is None:
        return False
    kind = source.guard_source  # a property in torch 2.13 (a method before)
    kind = kind() if callable(kind) else kind
    return kind.is_unspecialized_nn_module() or kind.is_specialized_nn_module()


def _is_channels_last(t) -> bool:
    """4-D with channels-last strides and C > 1 (real and symbolic fake tensors alike)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true as known

    if t.dim() != 4:
        return False
    _, c, _, w = t.shape
    stride = t.stride()
    return known(stride[1] == 1) and known(stride[3] == c) and known(stride[2] == c * w) and not known(c == 1)


def _symbol(size, shape_env):
    """A size as dynamo's shape environment simplifies it: an int, or a sympy expression."""
    if isinstance(size, torch.SymInt):
        expr = shape_env.simplify(size.node.expr) if shape_env is not None else size.node.expr
        return int(expr) if expr.is_number else expr
    return int(size)


def _classify(plan: _Plan, i: int, node, value) -> None:
    """Record what placeholder `i` (`node`, its example `value`) is."""
    grapharg = node.meta.get("grapharg")
    if not isinstance(value, torch.Tensor):
        raise _Unsupported(f"input {node.name} is a {type(value).__name__}")
    if value.device.type != "cpu":
        raise _Unsupported(f"input {node.name} is on {value.device} (accel runs on the CPU)")
    if torch.is_grad_enabled() and value.requires_grad:
        raise _Unsupported(
            f"grad mode is on and {node.name} requires grad: accel is inference only "
            "(call the compiled model under torch.no_grad() or torch.inference_mode())"
        )
    if grapharg is not None and grapharg.pass_arg_as_tensor:  # a Python number as a 0-d tensor
        plan.kinds.append("scalar" if _from_module(node) else "checked")
        plan.consts[i] = value.item()
    elif getattr(value, "_dynamo_static_input_type", None) is not None or _from_module(node):
        plan.kinds.append("const")
        plan.consts[i], plan.originals[i] = value.detach(), value
    else:
        plan.kinds.append("input")
        plan.inputs.append(i)
        fake = node.meta.get("example_value", getattr(grapharg, "fake_tensor", None))
        plan.fakes.append(value if fake is None else fake)
        mode = getattr(fake, "fake_mode", None)
        if mode is not None and mode.shape_env is not None:
            plan.shape_env = mode.shape_env


def _locate_sizes(plan: _Plan, pending: list, placeholders: list) -> None:
    """Each SymInt placeholder as (tensor input, dim) whose size it is; only plain symbols as dims."""
    plan.shapes = [[_symbol(s, plan.shape_env) for s in fake.shape] for fake in plan.fakes]
    for i, value in pending:
        expr = _symbol(value, plan.shape_env)
        where = [(k, d) for k, shape in enumerate(plan.shapes) for d, s in enumerate(shape) if s == expr]
        if not where:
            raise _Unsupported(f"symbolic int {placeholders[i].name} = {expr} is no size of a tensor input")
        plan.syms[i] = where[0]
    for k, shape in enumerate(plan.shapes):
        for d, s in enumerate(shape):
            if not isinstance(s, int) and not s.is_symbol:
                raise _Unsupported(f"input {k} dim {d} has size {s}, an expression (only plain symbols)")


def _plan(gm, example_inputs) -> _Plan:
    """What each placeholder of `gm` is, and the layouts of its inputs and outputs."""
    plan = _Plan()
    placeholders = gm.graph.find_nodes(op="placeholder")
    if len(placeholders) != len(example_inputs):
        raise _Unsupported(f"{len(placeholders)} placeholders but {len(example_inputs)} example inputs")
    plan.names = [node.name for node in placeholders]
    pending = []
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        if isinstance(value, (torch.SymInt, int)) and not isinstance(value, bool):
            plan.kinds.append("sym")
            pending.append((i, value))
        else:
            _classify(plan, i, node, value)
    _locate_sizes(plan, pending, placeholders)
    plan.input_cl = [_is_channels_last(example_inputs[i]) for i in plan.inputs]
    output = gm.graph.find_nodes(op="output")[0].args[0]
    plan.single = not isinstance(output, (tuple, list))
    varying = {node for node, kind in zip(placeholders, plan.kinds) if kind in ("input", "sym")}
    for node in gm.graph.nodes:  # in order: a node after its inputs
        if any(a in varying for a in node.all_input_nodes):
            varying.add(node)
    for out in [output] if plan.single else list(output):
        plan.output_fixed.append(out not in varying)
        value = out.meta.get("example_value", out.meta.get("val")) if isinstance(out, torch.fx.Node) else out
        if not isinstance(value, torch.Tensor):
            raise _Unsupported(f"graph output {out} is a {type(value).__name__}, not a tensor")
        plan.output_cl.append(_is_channels_last(value))
        plan.output_4d.append(value.dim() == 4)
    return plan


def _layouts(plan: _Plan, opts: dict) -> tuple[str | None, str | None]:
    """The build's (input_layout, output_layout), "auto" resolved from the tensors' strides."""
    layout_in, layout_out = opts["input_layout"], opts["output_layout"]
    four_d_in = [cl for cl, fake in zip(plan.input_cl, plan.fakes) if fake.dim() == 4]
    if layout_in == "auto":
        layout_in = "NHWC" if four_d_in and all(four_d_in) else None
    four_d_out = [cl for cl, is4 in zip(plan.output_cl, plan.output_4d) if is4]
    if layout_out == "auto":
        layout_out = "NHWC" if four_d_out and all(four_d_out) else None
    return layout_in, layout_out


def _attr(gm, target: str):
    value = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _closed_graph(gm, plan: _Plan) -> torch.fx.GraphModule:
    """`gm` with its constants as buffers, module floats as numbers and SymInts as sym_size."""
    graph, env, attrs, numbers = torch.fx.Graph(), {}, {}, {}
    placeholders = gm.graph.find_nodes(op="placeholder")
    tensor_inputs = {i: graph.placeholder(placeholders[i].name) for i in plan.inputs}
    for i, node in enumerate(placeholders):
        kind = plan.kinds[i]
        if kind == "input":
            env[node] = tensor_inputs[i]
        elif kind == "sym":
            k, d = plan.syms[i]
            env[node] = graph.call_function(torch.ops.aten.sym_size.int, (tensor_inputs[plan.inputs[k]], d))
        else:  # named after the placeholder (an error names it), unless gm has such an attribute
            value, name = plan.consts[i], node.name if not hasattr(gm, node.name) else f"accel_{node.name}"
            attrs[name] = value if kind == "const" else torch.tensor(value)
            env[node] = graph.get_attr(name)
            if kind != "const":
                numbers[node] = value  # for `.item()`
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "call_method" and node.target == "item" and node.args[0] in numbers:
            env[node] = numbers[node.args[0]]
            continue
        if node.op in ("get_attr", "call_module"):
            attrs[node.target] = _attr(gm, node.target)
        env[node] = graph.node_copy(node, lambda n: env[n])
    return torch.fx.GraphModule(attrs, graph)  # tensors in a dict root become buffers


def _dims(plan: _Plan) -> tuple | None:
    """torch.export's dynamic_shapes: Dim.DYNAMIC for each dim that dynamo made symbolic. Not
    dynamo's ranges: its guards hold more than its ranges say (a 3x3 conv's input, H >= 3,
    guarded H != 3 by the batch norm after it), which export would find violated; export infers
    each dim's range from the graph itself, and dynamo's guards keep the calls inside it."""
    if all(isinstance(s, int) for shape in plan.shapes for s in shape):
        return None
    dynamic = torch.export.Dim.DYNAMIC
    return tuple({d: dynamic for d, s in enumerate(shape) if not isinstance(s, int)} or None for shape in plan.shapes)


def _reason(err: BaseException) -> str:
    """The reason in a line: TVM's importer names the ops it has no converter for; accel's
    own errors say what they refuse."""
    from .errors import UnsupportedModelError

    text = str(err).strip()
    if "Unsupported function types" in text:
        ops = text.split("Unsupported function types", 1)[1].strip().splitlines()[0]
        return f"TVM's importer has no converter for aten op(s) {ops}"
    lines = [line for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else ""
    if isinstance(err, UnsupportedModelError):
        return line.removeprefix("accel: ")
    return f"{type(err).__name__}: {line}"[:400]


def _cache_key(gm, plan: _Plan, layouts, opts) -> str:
    """The graph's key in the disk cache: its code (placeholder names come from the model's
    sources: stable across processes), constants, input shapes (symbols renamed in order) and
    layouts, the options, accel's version."""
    digest = dynamo_cache.new_key(opts["tuning_db"])
    digest.update(gm.code.encode())
    for i, kind in enumerate(plan.kinds):
        digest.update(kind.encode())
        value = plan.consts.get(i)
        if isinstance(value, torch.Tensor):
            dynamo_cache.add_tensor(digest, value)
        elif value is not None:
            digest.update(repr(value).encode())
    names = {}
    for shape, fake, cl in zip(plan.shapes, plan.fakes, plan.input_cl):
        dims = [s if isinstance(s, int) else names.setdefault(s, f"d{len(names)}") for s in shape]
        ranges = [str(plan.shape_env.var_to_range.get(s)) for s in shape if not isinstance(s, int)]
        digest.update(f"{dims} {ranges} {fake.dtype} {cl}".encode())
    for node in gm.graph.find_nodes(op="get_attr"):
        value = _attr(gm, node.target)
        if isinstance(value, torch.Tensor):
            dynamo_cache.add_tensor(digest, value)
    digest.update(repr((layouts, plan.output_cl, opts["strict"], opts["tuning_db"])).encode())
    return digest.hexdigest()[:32]


def _build(gm, plan: _Plan, example_inputs, layouts, opts):
    """The loaded accel model of this graph: from the disk cache, or built and stored there."""
    import accel_target

    from .torch_ops import import_program

    folder = os.path.join(dynamo_cache.cache_dir(opts["cache_dir"]), _cache_key(gm, plan, layouts, opts))
    model = dynamo_cache.load_cached(folder)
    if model is not None:
        STATS["cache_hits"] += 1
        return model
    args = tuple(example_inputs[i].detach().contiguous() for i in plan.inputs)
    with torch.no_grad():
        program = torch.export.export(_closed_graph(gm, plan), args, dynamic_shapes=_dims(plan))
    try:
        mod = import_program(program)
    except Exception as err:
        raise _Unsupported(_reason(err)) from err
    executable = accel_target.build(
        mod,
        input_layout=layouts[0],
        output_layout=layouts[1],
        strict=opts["strict"],
        tuning_db=opts["tuning_db"],
        weights="separate",  # the library is code only; the folded weights beside it
    )
    STATS["builds"] += 1
    return dynamo_cache.store(executable, folder)


def _output_views(plan: _Plan, layout_out: str | None, option: str | None) -> tuple:
    """Per output: "nhwc" (NHWC memory: its channels-last NCHW view), "to_cl" (copied to
    channels-last, as eager returns it, where the output_layout `option` is "auto") or None."""
    views = []
    for cl, is4 in zip(plan.output_cl, plan.output_4d):
        if is4 and layout_out == "NHWC":
            views.append("nhwc")
        elif is4 and cl and option == "auto":
            views.append("to_cl")
        else:
            views.append(None)
    return tuple(views)


def _numbers_changed(gm, plan: _Plan, args, checked) -> bool:
    """Whether a number argument of forward differs from the one built in (warned)."""
    for i, value in checked:
        if args[i].item() != value:
            _warn(gm, f"argument {plan.names[i]} is not {value} as when compiled (this call runs in PyTorch)")
            return True
    return False


def _builder(gm, plan: _Plan, example_inputs, layouts, opts):
    """`build(originals)`: the loaded model of `gm` with the weights `originals` (placeholder
    index -> tensor) folded in."""

    def build(originals: dict):
        consts = {**plan.consts, **{i: t.detach() for i, t in originals.items()}}
        # dynamo calls the backend inside its TracingContext, whose fake mode and ShapeEnv
        # torch.export would take over (its guards would land in dynamo's: "Guard failed on
        # the same frame it was created"): export outside it.
        with torch._guards.tracing(None), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            return _build(gm, dataclasses.replace(plan, consts=consts), example_inputs, layouts, opts)

    return build


MAX_WEIGHT_SETS = 64  # models of one graph, one per set of weights it is called with


class _WeightSets:
    """The models of one graph, one per set of weights: dynamo compiles a module's forward once
    and calls it with the weights of every instance of the module as arguments (each layer of a
    transformer, where a graph break cuts the model at its layers). A set is the same tensor
    objects; the first call with a new set builds for it (`rebuild`: its weights folded in, the
    disk cache first). A set changed in place since its build (``load_state_dict``, an
    optimizer step) runs in PyTorch from then on, warned."""

    def __init__(self, gm, plan: _Plan, model, rebuild):
        self.gm, self.plan, self.rebuild = gm, plan, rebuild
        self.sets = [self._entry(plan.originals, model)]
        self.lock = threading.Lock()

    @staticmethod
    def _entry(originals: dict, model) -> dict:
        # the weights are folded in; dynamo does not guard their values ("unguarded" static inputs)
        watched = tuple((i, t, t._version) for i, t in originals.items())
        return {"watched": watched, "model": model, "weights": tuple(model.weights), "local": threading.local()}

    def _find(self, args) -> dict | None:
        for entry in self.sets:
            if all(args[i] is t for i, t, _ in entry["watched"]):
                return entry
        return None

    def model_for(self, args) -> dict | None:
        """The entry of `args`' weights (built on first sight), None where they run in PyTorch."""
        entry = self._find(args)
        if entry is None:
            with self.lock:
                entry = self._find(args) or self._add(args)
        if entry is None or entry.get("stale"):
            return None
        for i, t, version in entry["watched"]:
            if t._version != version:
                name = self.plan.names[i]
                _warn(self.gm, f"weight {name} changed after compiling; call torch.compiler.reset() to rebuild")
                entry["stale"] = True
                return None
        return entry

    def _add(self, args) -> dict | None:
        if len(self.sets) >= MAX_WEIGHT_SETS:
            _warn(self.gm, f"called with more than {MAX_WEIGHT_SETS} sets of weights (this set runs in PyTorch)")
            return None
        originals = {i: args[i] for i in self.plan.originals}
        try:
            entry = self._entry(originals, self.rebuild(originals))
        except Exception as err:  # noqa: BLE001  (these weights run in PyTorch)
            _warn(self.gm, f"rebuilding for another set of weights: {_reason(err)}")
            return None
        self.sets.append(entry)
        return entry


def _runner(gm, plan: _Plan, sets: _WeightSets, layouts, output_option):
    """The function dynamo calls for `gm`: the accel model of the weights it is called with on
    torch tensors; PyTorch where they are stale or a number differs from the one built in."""
    feeds = tuple((i, layouts[0] == "NHWC" and fake.dim() == 4) for i, fake in zip(plan.inputs, plan.fakes))
    views = _output_views(plan, layouts[1], output_option)
    checked = tuple((i, v) for i, v in plan.consts.items() if plan.kinds[i] == "checked")

    def run(*args):
        entry = sets.model_for(args)
        if entry is None or _numbers_changed(gm, plan, args, checked):  # dynamo guards no number
            return gm.forward(*args)
        local = entry["local"]
        if not hasattr(local, "main"):
            local.main = entry["model"].vm["main"]  # the calling thread's VM
        tensors = []
        for i, nhwc in feeds:
            t = args[i].permute(0, 2, 3, 1) if nhwc else args[i]  # channels-last memory as it is
            tensors.append(t if t.is_contiguous() else t.contiguous())
        result = local.main(*tensors, *entry["weights"])  # tvm-ffi: torch in through DLPack, torch out
        result = [result] if hasattr(result, "__dlpack__") else list(result)  # (one: not a tuple)
        # a tensor of TVM's where no torch tensor went in; a fixed one is the VM's constant
        result = [r if isinstance(r, torch.Tensor) else torch.from_dlpack(r) for r in result]
        result = [r.clone() if fixed else r for r, fixed in zip(result, plan.output_fixed)]
        for k, view in enumerate(views):
            if view == "nhwc":
                result[k] = result[k].permute(0, 3, 1, 2)  # NCHW view, channels-last strides
            elif view == "to_cl":
                result[k] = result[k].contiguous(memory_format=torch.channels_last)
        return result[0] if plan.single else tuple(result)

    run.accel_model = sets.sets[0]["model"]  # accel_target.report(run.accel_model): each op's kernel
    run.accel_weight_sets = sets.sets
    run.layouts = layouts
    return run


def _warn(gm, reason: str) -> None:
    """One AccelFallbackWarning per reason and graph size."""
    STATS["fallbacks"] += 1
    ops = sum(node.op in ("call_function", "call_method", "call_module") for node in gm.graph.nodes)
    message = f"accel: a graph of {ops} ops runs in PyTorch instead: {reason}"
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, AccelFallbackWarning, stacklevel=3)


def _options(options: dict | None, kwargs: dict) -> dict:
    """OPTIONS updated by `options` and keyword options, each checked."""
    opts = {**OPTIONS, **(options or {}), **kwargs}
    unknown = sorted(set(opts) - set(OPTIONS))
    if unknown:
        raise ValueError(f"accel backend: unknown option(s) {unknown}; known: {sorted(OPTIONS)}")
    for name in ("input_layout", "output_layout"):
        if opts[name] not in ("auto", None, "NHWC"):
            raise ValueError(f"accel backend: {name}={opts[name]!r}; expected 'auto', None or 'NHWC'")
    if opts["fallback"] not in ("warn", "raise"):
        raise ValueError(f"accel backend: fallback={opts['fallback']!r}; expected 'warn' or 'raise'")
    return opts


def accel_backend(gm: torch.fx.GraphModule, example_inputs, *, options: dict | None = None, mode=None, **kwargs):
    """TorchDynamo backend: compile one FX graph `gm` for accel (see the module docstring).

    options (``torch.compile(..., options={...})``; keyword options too, e.g. with
    ``functools.partial``): OPTIONS' keys: input_layout / output_layout ("auto": NHWC where the
    4-D tensors are channels-last, as they arrive and as eager returns them; None: NCHW;
    "NHWC"), strict and tuning_db (as `accel_target.build` takes them), cache_dir, fallback.
    mode: torch.compile's mode (accel has one; ignored). An unknown option raises (dynamo
    reports it as BackendCompilerFailed); anything else that fails runs the graph in PyTorch.
    Returns the function dynamo calls with the graph's inputs.
    """
    opts = _options(options, kwargs)
    STATS["compiles"] += 1
    try:
        plan = _plan(gm, example_inputs)
        layouts = _layouts(plan, opts)
        build = _builder(gm, plan, example_inputs, layouts, opts)
        sets = _WeightSets(gm, plan, build(plan.originals), build)
        return _runner(gm, plan, sets, layouts, opts["output_layout"])
    except Exception as err:  # noqa: BLE001  (whatever fails: the graph runs in PyTorch)
        if opts["fallback"] == "raise":
            raise
        _warn(gm, str(err) if isinstance(err, _Unsupported) else _reason(err))
        return gm.forward


__all__ = ["OPTIONS", "STATS", "AccelFallbackWarning", "accel_backend"]
