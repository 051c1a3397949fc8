"""The scopes: what a cell times around a variant's attention call, each one ``Scope``
(the protocol: bench.model.scope), declared in bench/model/features.py.

- core.py: the call alone, on the case's q, k and v, against the case's float64 reference;
- layer.py: the seeds' multi-head block, encoder and decoder layers around it (its shapes, parts
  and FLOPs), and layer_run.py: their tensors, the timed parts and the float64 layer's check.

A scope module is read when the flags are read, without torch; what runs in the worker imports it
inside the scope's methods.
"""
