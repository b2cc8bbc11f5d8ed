"""A fake GPU list for TensorFlow, installed at the one boundary keras_ddl
talks to (``tf.config``), so GPU placement is tested on a machine without
GPUs. Records what keras_ddl asked for."""

import tensorflow as tf


class FakeGpus:
    """Pretends ``count`` GPUs exist.

    Args:
        count: How many GPUs ``list_physical_devices("GPU")`` returns.
        runtime_started: Behave like TensorFlow after its runtime started:
            changing the visible GPUs raises RuntimeError (as TF does), and
            so does changing memory growth.
    """

    def __init__(self, count, runtime_started=False):
        self.devices = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU")
                        for i in range(count)]
        self.visible = list(self.devices)
        self.runtime_started = runtime_started
        self.growth = {}
        self._saved = None

    def list_physical_devices(self, device_type=None):
        if device_type == "GPU":
            return list(self.devices)
        return self._saved[0](device_type)

    def get_visible_devices(self, device_type=None):
        if device_type == "GPU":
            return list(self.visible)
        return self._saved[1](device_type)

    def set_visible_devices(self, devices, device_type=None):
        assert device_type == "GPU", device_type
        if self.runtime_started and list(devices) != self.visible:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self.visible = list(devices)

    def set_memory_growth(self, device, enable):
        if self.runtime_started:
            raise RuntimeError("Physical devices cannot be modified after being initialized")
        self.growth[device.name] = enable

    def install(self):
        """Replaces the four tf.config functions; returns self."""
        c = tf.config
        self._saved = (c.list_physical_devices, c.get_visible_devices, c.set_visible_devices,
                       c.experimental.set_memory_growth)
        c.list_physical_devices = self.list_physical_devices
        c.get_visible_devices = self.get_visible_devices
        c.set_visible_devices = self.set_visible_devices
        c.experimental.set_memory_growth = self.set_memory_growth
        return self

    def uninstall(self):
        c = tf.config
        (c.list_physical_devices, c.get_visible_devices, c.set_visible_devices,
         c.experimental.set_memory_growth) = self._saved
