"""`explain`: what a model folder resolves to, and why: its config, architecture and provider, the backend of
each attention layer group and the MoE kernel with every candidate's reason, the KV cache, and (asked for) what a
KV budget holds and which kernel each linear runs. `explain_model` builds the document (docs/explain-schema.md),
`render_text` prints it; `kernelbay explain` is the command."""

from .document import explain_model, render_text

__all__ = ["explain_model", "render_text"]
