"""Stage 1, trace: a model's training step as an ATen-level fx graph on fake tensors.

Entry point ``tracer.trace_model(model, example_inputs) -> TracedGraph``. Also here:
data-dependent regions kept opaque (``opaque.py``), stacks of identical layers cut to two
(``repeats.py``), how a training step calls the model (``training_call.py``) and which
output is its loss (``loss.py``).
"""
