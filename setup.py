"""Flux's one C module: the walks of a large dedup window's index
(``flux/shard/_serial_probe.c``). Optional: without a C compiler Flux installs without
it and walks the index with numpy instead (slower). Everything else is in
pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("flux.shard._serial_probe", ["flux/shard/_serial_probe.c"],
                             optional=True)])
