"""Chat templates: family detection, the model's Jinja, the Go TEMPLATE Ollama runs, their proof, the Modelfile."""
