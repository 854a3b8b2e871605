"""kernelbay-acme-llama: Acme's build of LlamaForCausalLM (`kernelbay_acme_llama.modeling`).

A separate distribution from kernelbay-acme because a model needs the runtime: this one requires
kernelbay-llama (and so kernelbay-engine), while Acme's platform and kernel require the contract alone.
Entry point `kernelbay.models: LlamaForCausalLM`: it takes the built-in Llama slot; off Acme hardware it
declines (`NoTarget`) and kernelbay falls back to the built-in implementation.
"""
