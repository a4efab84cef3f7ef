"""What every track uses and none owns: the model layer (`models/`), policy engines (`policy/`),
the run scope, prompt templates, the tenured heap and embeddings. Imports no track.
"""
