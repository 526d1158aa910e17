"""What is served: Ollama Modelfiles and cards, vLLM serving configs and cards, the serving planner."""
