"""Click models fitted on served lists and their clicks (docs/click-models.md).

``evald.clicks.models`` makes and rebuilds models (``new_model``, ``build``); this package
imports nothing itself, so the commands' parsers (``evald replay --click-model``) stay light.
"""
