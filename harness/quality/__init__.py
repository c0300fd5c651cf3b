"""What a quantized KV cache does to a real decoder's output: perplexity, KL divergence from the
full-precision cache, top-1 agreement and greedy tokens before divergence, with the quantized
cache read by every scored token (``protocol``); the model and text every machine can have
(``model``); the caches compared (``caches``); and a one-pass emulation of cache schemes the
kernels do not implement yet, for choosing among them (``emulate``)."""
