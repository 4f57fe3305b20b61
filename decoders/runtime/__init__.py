"""The runtime: loading models (models, model_files, hub, residency, dtype_choice), this device's kernels (kernels,
fused), and running forwards over a KV cache (cache, buffers, graphs, runner). It knows nothing of drafting,
verification or traces; of the rest of decoders/ it reads only the draft tree's shape (tree.py) and the error type
(errors.py). The decoders above import it, never the reverse (tests/test_import_graph.py checks for circles)."""
