r"""Capture: the graph of a network's forward, at the level of its layers, neurons and containers.

:func:`capture` is the one front end that :func:`~snnquant.quantize_model` (through
:func:`~snnquant.capture.plan_folding`), :func:`~snnquant.export.fold_batchnorm` and
:func:`~snnquant.export.to_integer` read. It answers :meth:`Capture.graph` (a
:class:`torch.fx.Graph` of one module's forward: ``call_module`` nodes for layers, neurons and
SpikingJelly containers, kept whole, and ``call_function`` / ``call_method`` nodes for the
operations between them), in one of two ways:

* **from a run** (an example input is given): the model runs once on the example input, in eval
  mode, on a copy; forward hooks record every module call and a :class:`TorchFunctionMode` records
  every torch operation between them. Python that depends only on shapes (``if x.ndim != 5:
  raise``), loops over ``nn.ModuleList`` blocks and any other control flow simply runs; what is
  recorded is the path the example input takes;
* **symbolically** (no example input): :mod:`torch.fx` symbolic tracing with
  :class:`SpikingTracer`, as before; it stops at Python that inspects a traced value.

Both keep snnquant's and SpikingJelly's layers, neurons and containers whole (see
:meth:`SpikingTracer.is_leaf_module`) and record, on every node, the module it came from
(``meta["nn_module_stack"]``) and the statement (``meta["stack_trace"]``), so that an error names
the innermost submodule and the file and line (:func:`node_origin`); a capture from a run also
records the shape of every tensor on the example input (``meta["shape"]``), which the integer
export reads to turn layout operations into index maps. When a capture fails, the
:class:`CaptureError` names the innermost submodule, its class, the file and line that stopped it,
and what to change (:func:`where_it_stopped`).
"""

from __future__ import annotations

import builtins
import linecache
import operator
import os
import re
import sys
import traceback
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

__all__ = ["capture", "Capture", "CaptureError", "ExportError", "SpikingTracer", "is_sequence",
           "connect_functions", "node_origin", "where_it_stopped"]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_THIS_FILE = os.path.abspath(__file__)
_EXAMPLE_INPUT_HINT = "example_input=x (one input batch the model accepts)"


class ExportError(ValueError):
    """A layer cannot be represented exactly as an integer operation; the message names it and why.

    Defined with the capture, which raises it too; :mod:`snnquant.export` exports it."""


class CaptureError(ExportError):
    """The forward of a module could not be captured; the message names where and what to change."""


def is_sequence(m) -> bool:
    """A container whose children run one after the other (what :func:`model_walk` flattens)."""
    from spikingjelly.activation_based import layer
    if isinstance(m, (layer.SeqToANNContainer, layer.MultiStepContainer, layer.StepModeContainer)):
        return True
    return isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward


def connect_functions() -> tuple:
    """SpikingJelly's residual connect functions, kept as one call (``sew_function``)."""
    # a model built from sew_resnet's blocks has imported it; importing it here costs seconds
    sew = sys.modules.get("spikingjelly.activation_based.model.sew_resnet")
    function = getattr(sew, "sew_function", None)
    return (function,) if function is not None else ()


class SpikingTracer(torch.fx.Tracer):
    """torch.fx tracer that keeps layers, neurons and SpikingJelly containers whole.

    Shared by :func:`fold_batchnorm` and :func:`~snnquant.export.to_integer`. SpikingJelly's
    ``sew_resnet.sew_function`` (the connect function ``cnf``) stays one call node.
    """

    def __init__(self):
        super().__init__(autowrap_functions=connect_functions())
        self.record_stack_traces = True

    def is_leaf_module(self, m, module_qualified_name):
        """Sequence containers of SpikingJelly, step and memory modules (layers, neurons),
        BatchNorms and PyTorch's own modules are leaves; a plain ``nn.Sequential`` and user modules are not."""
        from spikingjelly.activation_based import base
        if isinstance(m, nn.Sequential) and type(m).forward is nn.Sequential.forward:
            return False
        if is_sequence(m) or isinstance(m, (base.StepModule, base.MemoryModule)) or \
                isinstance(m, nn.modules.batchnorm._BatchNorm):
            return True
        return super().is_leaf_module(m, module_qualified_name)


def _kept_whole(m) -> bool:
    """Modules whose inside no consumer asks about: synaptic layers, neurons, BatchNorm, modules
    without children."""
    from spikingjelly.activation_based import neuron
    from ..nn import registry
    return (next(m.children(), None) is None or registry.layer_kind(m) is not None
            or isinstance(m, (neuron.BaseNode, nn.modules.batchnorm._BatchNorm)))


# --------------------------------------------------------------------------------------------------
# where: the module and the statement

def _user_frame(frame) -> Optional[Tuple[str, int, str]]:
    """``(file, line, function)`` of the innermost frame outside torch and this file."""
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_TORCH_DIR) and os.path.abspath(path) != _THIS_FILE:
            return path, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return None


def _stack_text(where) -> str:
    if where is None:
        return ""
    path, line, func = where
    code = linecache.getline(path, line).strip()
    return f'  File "{path}", line {line}, in {func}\n    {code}\n'


def _where(frame) -> str:
    """``'file:line'`` of the innermost frame outside torch and this file."""
    where = _user_frame(frame)
    return _short(where[0], where[1]) if where else ""


def _short(path: str, line: int) -> str:
    parts = path.replace(os.sep, "/").split("/")
    return f"{'/'.join(parts[-2:])}:{line}"


_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+)')


def node_origin(node: torch.fx.Node, prefix: str, owner: nn.Module) -> Tuple[str, str, str]:
    """``(module name, class name, 'file:line')`` that produced ``node`` in the captured graph
    of module ``owner`` named ``prefix``: the innermost module on its module stack (else
    ``owner``) and its last statement outside torch (an empty string where unknown)."""
    stack = node.meta.get("nn_module_stack") or {}
    name, cls = prefix, type(owner).__name__
    if stack:
        path, (_, kind) = list(stack.items())[-1]
        path = path if not prefix else (f"{prefix}.{path}" if path else prefix)
        name, cls = path, getattr(kind, "__name__", str(kind))
    where = ""
    for path, line in _FRAME_RE.findall(node.meta.get("stack_trace") or ""):
        if not path.startswith(_TORCH_DIR):
            where = _short(path, int(line))
    return name, cls, where


def where_it_stopped(err: BaseException, names: Dict[int, str]) -> Tuple[str, str, str]:
    """``(module name, class name, 'file:line')`` of the innermost module of ``names`` (``id`` ->
    dotted name) whose method is on ``err``'s traceback, and the last statement outside torch."""
    module, where = None, None
    for frame, line in traceback.walk_tb(err.__traceback__):
        owner = frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in names:
            module = owner
        path = frame.f_code.co_filename
        if not path.startswith(_TORCH_DIR) and os.path.abspath(path) != _THIS_FILE:
            where = (path, line)
    name = names.get(id(module), "") if module is not None else ""
    return (name, type(module).__name__ if module is not None else "",
            _short(*where) if where else "")


def _failure(err: BaseException, names: Dict[int, str], root: nn.Module) -> Tuple[str, str]:
    """``("layer 'a.b' (Block) at file.py:12", "TypeError: the first line of err")``."""
    inner, cls, where = where_it_stopped(err, names)
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return _describe_stop(inner, cls or type(root).__name__, where), f"{type(err).__name__}: {text}"


def _describe_stop(name: str, cls: str, where: str) -> str:
    what = f"layer {name!r} ({cls})" if name else (f"the model ({cls})" if cls else "the model")
    return what + (f" at {where}" if where else "")


# --------------------------------------------------------------------------------------------------
# the capture

class Capture:
    """Graphs of a model's modules, from a run (:func:`capture` with an example input) or from
    torch.fx symbolic tracing; :meth:`graph` is all that consumers read."""

    def __init__(self, model: nn.Module, graphs: Optional[Dict[str, torch.fx.Graph]] = None,
                 example_input: Optional[tuple] = None):
        self.model, self.example_input = model, example_input
        self.from_run = graphs is not None
        self._graphs = graphs

    def graph(self, name: str, module: nn.Module) -> torch.fx.Graph:
        """The graph of ``module``'s forward (``name`` is its dotted name in the model; node
        targets are relative to it). Raises :class:`CaptureError` naming where it stopped."""
        if self.from_run:
            if name not in self._graphs:
                raise CaptureError(f"{_describe_stop(name, type(module).__name__, '')}: it is "
                                   f"never called in the forward pass on the example input")
            return self._graphs[name]
        try:
            return SpikingTracer().trace(module)
        except Exception as err:  # shape checks, data-dependent control flow and the like
            names = {id(m): (f"{name}.{n}" if name and n else name or n)
                     for n, m in module.named_modules()}
            where, error = _failure(err, names, module)
            raise CaptureError(
                f"torch.fx cannot trace the forward() of {where} ({error}); pass "
                f"{_EXAMPLE_INPUT_HINT} so that the graph is captured from a run, where Python "
                f"that depends on shapes runs as it is") from None


def capture(model: nn.Module, example_input=None) -> Capture:
    """Capture ``model``'s graph: from a run on ``example_input`` (a tensor or a tuple of
    tensors), or, without one, by torch.fx symbolic tracing (see the module docstring).

    The run uses a deep copy of ``model`` in eval mode without gradients, so ``model`` (its
    neuron states, BatchNorm statistics, quantizers) is not changed.

    Raises:
        CaptureError: the forward pass raised on the example input; the message names the
            innermost submodule, its class, the file and line, and the error.
    """
    if example_input is None:
        return Capture(model)
    if isinstance(example_input, torch.Tensor):
        example_input = (example_input,)
    if not isinstance(example_input, (tuple, list)) or not all(
            isinstance(t, torch.Tensor) for t in example_input):
        raise TypeError(f"example_input must be a tensor or a tuple of tensors, got "
                        f"{type(example_input).__name__}")
    example_input = tuple(example_input)
    return Capture(model, _Recorder(model).run(example_input), example_input)


class _Frame:
    """The graph of one module call being recorded: its nodes and which node holds each tensor."""

    def __init__(self, name: str, inputs):
        self.name, self.graph, self.env = name, torch.fx.Graph(), {}
        for i, t in enumerate(inputs):
            if isinstance(t, torch.Tensor):
                self.env[id(t)] = self.graph.placeholder(f"input_{i}")
                self.env[id(t)].meta["shape"] = tuple(t.shape)

    def relative(self, name: str) -> str:
        """``name`` (dotted, from the model) relative to the module of this frame."""
        if not self.name:
            return name
        return name[len(self.name) + 1:] if name.startswith(self.name + ".") else name


class _Recorder(TorchFunctionMode):
    """Record module calls (hooks) and torch operations (this mode) during one forward pass."""

    def __init__(self, model: nn.Module):
        super().__init__()
        from ..utils import copy_model
        self.model = copy_model(model)
        self.names = {}
        for n, m in self.model.named_modules():
            self.names.setdefault(id(m), n)
        self.tensors = {}
        for n, t in list(self.model.named_parameters()) + list(self.model.named_buffers()):
            self.tensors.setdefault(id(t), n)
        self.graphs: Dict[str, torch.fx.Graph] = {}
        self.listening: List[_Frame] = []
        self.calls: List[tuple] = []     # per open module call: (listening before it, frames
        #                                  with a call_module node for it, its own frame, name)
        self.silent = 0                  # > 0 inside a module kept whole
        self.stack: "OrderedDict[str, tuple]" = OrderedDict()
        self.keep = []                   # every tensor seen stays alive: ids are not reused

    # ---- the run ---------------------------------------------------------------------------
    def run(self, inputs) -> Dict[str, torch.fx.Graph]:
        from spikingjelly.activation_based import functional as sjf
        root = _Frame("", inputs)
        self.keep.extend(inputs)
        self.listening = [root]
        handles = []
        for m in self.model.modules():
            if m is not self.model:
                handles.append(m.register_forward_pre_hook(self._enter, with_kwargs=True))
                handles.append(m.register_forward_hook(self._leave, with_kwargs=True))
        patched = self._wrap_connect_functions()
        model = self.model.eval()
        try:
            sjf.reset_net(model)
            with torch.no_grad(), self:
                out = model(*inputs)
        except CaptureError:
            raise
        except Exception as err:
            where, error = _failure(err, self.names, model)
            shapes = ", ".join(str(tuple(t.shape)) for t in inputs)
            raise CaptureError(
                f"the forward pass on the example input (shape {shapes}) failed in {where}: "
                f"{error}; pass an example input the model accepts (the shape [T, N, ...] of a "
                f"multi-step network, [N, ...] of a single-step one) and check that the model "
                f"runs on it") from None
        finally:
            for h in handles:
                h.remove()
            for module, attr, original in patched:
                setattr(module, attr, original)
        root.graph.output(self._arg(root, out))
        self.graphs.setdefault("", root.graph)
        return self.graphs

    def _wrap_connect_functions(self):
        """Replace SpikingJelly's connect functions by recording wrappers (one node per call)
        for the run, as torch.fx's ``autowrap_functions`` patches them for its trace."""
        patched = []
        for function in connect_functions():
            module = sys.modules[function.__module__]
            setattr(module, function.__name__, self._opaque_function(function))
            patched.append((module, function.__name__, function))
        return patched

    def _opaque_function(self, function):
        def call(*args, **kwargs):
            if self.silent or not self.listening:
                return function(*args, **kwargs)
            self.silent += 1
            try:
                out = function(*args, **kwargs)
            finally:
                self.silent -= 1
            self._record("call_function", function, args, kwargs, out, mutates=False)
            return out
        call.__wrapped__ = function
        return call

    # ---- module calls ------------------------------------------------------------------------
    def _enter(self, module, args, kwargs):
        name = self.names.get(id(module))
        if name is None:
            return None  # not part of the model: its operations are recorded inline
        if self.silent:
            self.silent += 1
            self.calls.append(None)
            return None
        self.stack[name] = (name, type(module))
        where = _user_frame(sys._getframe(1))
        opaque = SpikingTracer().is_leaf_module(module, name)
        paused = []
        if opaque:
            for frame in self.listening:
                node = frame.graph.call_module(frame.relative(name),
                                               self._arg(frame, tuple(args)),
                                               self._arg(frame, dict(kwargs)))
                self._meta(frame, node, where)
                paused.append((frame, node))
        saved = self.listening
        frame = None
        if opaque and _kept_whole(module):
            self.silent += 1
            self.listening = []
        else:  # its own graph, and inlined in the graphs that do not keep it whole
            frame = _Frame(name, args)
            self.keep.extend(args)
            self.listening = ([] if opaque else list(saved)) + [frame]
        self.calls.append((saved, paused, frame, name))
        return None

    def _leave(self, module, args, kwargs, output):
        if self.names.get(id(module)) is None:
            return None
        entry = self.calls.pop()
        if entry is None:
            self.silent -= 1
            return None
        saved, paused, frame, name = entry
        if frame is None:
            self.silent -= 1
        else:
            frame.graph.output(self._arg(frame, output))
            self.graphs.setdefault(name, frame.graph)
        self.keep.append(output)
        for parent, node in paused:
            self._bind(parent, output, node)
        self.listening = saved
        self.stack.pop(name, None)
        return None

    # ---- operations --------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        """Run ``func``; outside modules kept whole, record it in every listening graph."""
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.silent or not self.listening:
            return out
        if getattr(func, "__name__", "") in _VALUE_READS and args and self._computed(args[0]):
            raise CaptureError(
                f"{_describe_stop(*self._innermost(), _where(sys._getframe(1)))}"
                f" reads the value of a tensor the network computes ({func.__name__}), for "
                f"example to branch on it: a graph captured from one run would follow only the "
                f"example input's path. Compute it with tensor operations (torch.where, masks) "
                f"or move it out of forward()")
        op, target, args, mutates = _as_node_target(func, args)
        if target is None:
            return out
        if mutates and args and isinstance(args[0], torch.Tensor) and args[0]._base is not None \
                and self._computed(args[0]) and self._computed(args[0]._base):
            # a view of a recorded value: changing it changes that value, which the graph
            # would not show (a view of a module's internal tensor, as a multi-step layer's
            # output reshaped back to [T, N, ...], changes nothing recorded)
            raise CaptureError(
                f"{_describe_stop(*self._innermost(), _where(sys._getframe(1)))} changes a view "
                f"of a tensor in place ({getattr(func, '__name__', func)}), which also changes "
                f"the tensor it views: the graph would not show that change. Write it out of "
                f"place (y = x + z instead of x[...] += z or x.view(...).add_(z))")
        if not mutates and not any(isinstance(t, torch.Tensor) for t in _flatten(out)):
            return out  # shapes, dims, dtypes: constants of this capture
        self._record(op, target, args, kwargs, out, mutates)
        return out

    def _record(self, op, target, args, kwargs, out, mutates):
        where = _user_frame(sys._getframe(2))
        self.keep.append(out)
        for frame in self.listening:
            node = frame.graph.create_node(op, target, self._arg(frame, tuple(args)),
                                           self._arg(frame, dict(kwargs)))
            self._meta(frame, node, where)
            self._bind(frame, out, node)
            if mutates and args and isinstance(args[0], torch.Tensor):
                frame.env[id(args[0])] = node

    # ---- values ------------------------------------------------------------------------------
    def _computed(self, value) -> bool:
        """Whether ``value`` is a tensor the recorded graph computes from the input."""
        frame = self.listening[-1]
        node = frame.env.get(id(value)) if isinstance(value, torch.Tensor) else None
        return node is not None and node.op != "get_attr"

    def _innermost(self) -> Tuple[str, str]:
        if not self.stack:
            return "", type(self.model).__name__
        name, (_, kind) = list(self.stack.items())[-1]
        return name, kind.__name__

    def _meta(self, frame, node, where):
        stack = OrderedDict()
        for path, (qual, kind) in self.stack.items():
            if frame.name == "" or path.startswith(frame.name + "."):
                rel = frame.relative(path)
                stack[rel] = (rel, kind)
        node.meta["nn_module_stack"] = stack
        node.meta["stack_trace"] = _stack_text(where)

    def _bind(self, frame, value, node):
        """Bind ``value`` (a tensor, or a tuple of them) to ``node``; a tensor's shape goes to
        ``node.meta['shape']`` (the shape on the example input, which consumers read for
        layout operations)."""
        if isinstance(value, torch.Tensor):
            frame.env[id(value)] = node
            node.meta["shape"] = tuple(value.shape)
        elif isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                if isinstance(v, torch.Tensor):
                    item = frame.graph.call_function(operator.getitem, (node, i))
                    item.meta["shape"] = tuple(v.shape)
                    frame.env[id(v)] = item

    def _arg(self, frame, value):
        if isinstance(value, torch.Tensor):
            node = frame.env.get(id(value))
            if node is None:
                self.keep.append(value)
                name = self.tensors.get(id(value))
                target = frame.relative(name) if name is not None else \
                    f"<a tensor of shape {tuple(value.shape)} made outside the recorded forward>"
                node = frame.env[id(value)] = frame.graph.get_attr(target)
            return node
        if isinstance(value, tuple) and not isinstance(value, torch.Size):
            return tuple(self._arg(frame, v) for v in value)
        if isinstance(value, list):
            return [self._arg(frame, v) for v in value]
        if isinstance(value, dict):
            return {k: self._arg(frame, v) for k, v in value.items()}
        return value


_OPERATORS = {"__getitem__": operator.getitem, "__setitem__": operator.setitem}
# reading a computed tensor's value into Python: what a capture from one run cannot follow
_VALUE_READS = {"__bool__", "item", "tolist", "__int__", "__float__", "__index__"}


def _as_node_target(func, args):
    """``(op, target, args, mutates)`` of a torch call as torch.fx symbolic tracing writes it:
    Tensor methods as ``call_method`` by name, ``x[i]`` as ``operator.getitem``, attributes as
    ``getattr``; ``(None, None, ...)`` for a call that is not worth a node."""
    name = getattr(func, "__name__", "")
    owner = getattr(func, "__qualname__", "").split(".")[0]
    if name == "__get__":  # a tensor attribute (x.T, x.data)
        attr = getattr(getattr(func, "__self__", None), "__name__", None)
        return ("call_function", builtins.getattr, tuple(args) + (attr,), False) if attr \
            else (None, None, args, False)
    if name in _OPERATORS:
        return "call_function", _OPERATORS[name], args, name == "__setitem__"
    if owner in ("TensorBase", "Tensor"):
        mutates = (name.endswith("_") and not name.endswith("__")) or (
            name.startswith("__i") and name.endswith("__"))
        return "call_method", name, args, mutates
    return "call_function", func, args, name.endswith("_") and not name.endswith("__")


def _flatten(value):
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from _flatten(v)
    else:
        yield value
