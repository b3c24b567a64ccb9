"""The trivial Python function bench_jvm.py calls from Java (PythonFunction.call) and from Python
in the same process: what the call path itself costs."""


def add(a, b):
    return a + b
