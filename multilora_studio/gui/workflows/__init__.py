"""The window's workflows as plain models (no Qt): the state and the rules of Compare, Evaluate and
the Library's selection. Views bind their widgets to these models; the rules are tested without a
window (``tests/workflows``).
"""
