"""Flux's C modules: the walks of a large dedup window's index
(``flux/shard/_serial_probe.c``) and a shared subscription member's held offsets and keys
(``flux/shard/_held_keys.c``). Optional: without a C compiler Flux installs without them
and uses numpy or Python instead (slower). Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("flux.shard._serial_probe", ["flux/shard/_serial_probe.c"],
                             optional=True),
                   Extension("flux.shard._held_keys", ["flux/shard/_held_keys.c"],
                             optional=True)])
