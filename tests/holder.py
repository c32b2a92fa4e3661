"""A plain holder of tensors that a traced step reads as its parameters."""


class Holder:
    """Tensors a compiled step's closure reaches through ``parameters()``, as it reaches a model's."""

    def __init__(self, params):
        self.params = params

    def parameters(self):
        return self.params
