"""Optional integrations: the package's kernels behind other libraries' interfaces.

``transformers``  an attention implementation for Hugging Face transformers models
                  (``register()``; imports transformers only when called)
"""
