"""Plugin modules that ship code (kernels) wired into vLLM by runtime patches.

Each subpackage imports torch and triton lazily: sndr's core install has neither.
"""
