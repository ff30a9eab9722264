"""The one compiled part of sparkmq (everything else is in pyproject.toml): ``sparkmq._wire``,
the plain RocketMQ SendMessage request read into column buffers (sparkmq/_wire.c).
Optional: where it cannot be built, the broker reads every request in Python."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("sparkmq._wire", ["sparkmq/_wire.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wextra"])])
