"""Governing agents where they already are: one tool policy file (`policy`), a framework-neutral
governed call (`core`), and the integrations built on them -- the MCP gateway (`mcp`, the
`sagaplane[mcp]` extra), LangGraph (`langgraph`) and the OpenAI Agents SDK (`openai_agents`).
Importing this package imports no optional dependency."""
