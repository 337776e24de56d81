"""Thirteenth session: on PYTHONPATH, turns Python's garbage collector off in every process started."""
import gc

gc.disable()
