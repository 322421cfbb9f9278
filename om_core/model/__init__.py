"""The model side: one call through litellm with retries and a record of each call, the circuit breaker and preflight, prices and budgets, and om logs (a read path: no litellm import here)."""
