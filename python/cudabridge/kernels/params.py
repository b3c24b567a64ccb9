"""Kernel parameter kinds and the parameter buffer, where task code finds them: they live in
``cudabridge/device/params.py`` (the device interface's launches take them) and are re-exported
here unchanged."""

from ..device.params import PARAM_KINDS, DevicePointer, check_args, check_value, pack_params, param_layout, signature

__all__ = ["PARAM_KINDS", "DevicePointer", "check_args", "check_value", "pack_params", "param_layout", "signature"]
