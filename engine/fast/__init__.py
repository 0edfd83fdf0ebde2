"""The same digits in less time: passes that give transformers' own numbers bit for bit, each
used only after a probe on this machine has shown it.

- `exact_rows_kernel.py` / `.cpp`: rows through a linear layer, each summed in the order this
  CPU's 1-row product sums (several visitors' rows at once, or a lone row at memory speed);
- `scripted_llama.py`: Llama-family passes as one TorchScript call (several visitors' decode
  steps, several prompts, one visitor's decode step, or a verify pass of several tokens);
- `row_products.py`: rows as 1-row products in one batched call, where the kernel is not used;
- `lone.py`: a lone visitor's decode step through the scripted pass and the kernel, and the
  verify pass whose every row has the digits of the decode step that would read it.

Importing this package builds and registers nothing: the kernel is built on first use.
"""
