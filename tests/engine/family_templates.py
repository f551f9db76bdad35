"""Chat templates in the style of each family's documented tool format, written for these tests.

Each renders tools, earlier calls and tool results the way that family's model card describes; they
are small, not the published templates.
"""

from __future__ import annotations

# Qwen 3 style: ChatML, tools in the system message, <tool_call> blocks, results in <tool_response>,
# an enable_thinking switch (off: an empty think block opens the reply).
QWEN3 = """
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each function call, return a json object within <tool_call></tool_call> XML tags.<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' %}<|im_start|>user
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content }}
{%- if message.tool_calls %}{% for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}{% endif %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}{% endif %}
"""

# DeepSeek R1 style: the generation prompt opens the think block itself.
R1 = """
{%- for message in messages %}
{%- if message.role == 'user' %}<｜User｜>{{ message.content }}
{%- elif message.role == 'assistant' %}<｜Assistant｜>{{ message.content }}<｜end▁of▁sentence｜>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<｜Assistant｜><think>
{% endif %}
"""

# Llama 3.1 style: tools as JSON in the first user message, calls as a JSON object with
# "parameters", results in the ipython role.
LLAMA31 = """
{{- bos_token }}
{%- for message in messages %}
{%- if message.role == 'user' and loop.first and tools %}<|start_header_id|>user<|end_header_id|>

Given the following functions, respond with a JSON for a function call with its proper arguments.
Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.

{% for tool in tools %}{{ tool | tojson(indent=4) }}

{% endfor %}{{ message.content }}<|eot_id|>
{%- elif message.role == 'assistant' and message.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{%- set call = message.tool_calls[0].function %}
{"name": "{{ call.name }}", "parameters": {{ call.arguments | tojson }}}<|eot_id|>
{%- elif message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}
"""

# Mistral style: [AVAILABLE_TOOLS] before the last user message, [TOOL_CALLS], [TOOL_RESULTS], and
# call ids that must be 9 letters and digits.
MISTRAL = """
{{- bos_token }}
{%- for message in messages %}
{%- if message.role == 'user' %}
{%- if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}
[INST]{{ message.content }}[/INST]
{%- elif message.role == 'assistant' and message.tool_calls %}[TOOL_CALLS][
{%- for call in message.tool_calls %}
{%- if call.id | length != 9 %}{{ raise_exception('tool call ids must be 9 characters') }}{% endif %}
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}, "id": "{{ call.id }}"}
{%- if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}
{%- elif message.role == 'tool' %}[TOOL_RESULTS]{"content": {{ message.content | tojson }},
{{- ' ' }}"call_id": "{{ message.tool_call_id }}"}[/TOOL_RESULTS]
{%- elif message.role == 'assistant' %}{{ message.content }}{{ eos_token }}
{%- endif %}
{%- endfor %}
"""

# A template with no tool support at all (it ignores tools and knows no tool role).
NO_TOOLS = """
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
"""

# gpt-oss style (OpenAI's harmony format): a reasoning_effort switch, tools as a TypeScript-like
# namespace in the developer message, calls on the commentary channel, results from functions.NAME.
HARMONY = """
{%- set effort = reasoning_effort if reasoning_effort is defined else 'medium' -%}
<|start|>system<|message|>You are a helpful assistant.
Reasoning: {{ effort }}

# Valid channels: analysis, commentary, final.
{%- if tools %} Calls to these tools must go to the commentary channel: 'functions'.{% endif %}<|end|>
{%- if messages[0].role == 'system' or tools %}<|start|>developer<|message|>
{%- if messages[0].role == 'system' %}# Instructions

{{ messages[0].content }}

{% endif %}
{%- if tools %}# Tools

## functions

namespace functions {
{% for tool in tools %}
// {{ tool.function.description }}
type {{ tool.function.name }} = (_: {{ tool.function.parameters | tojson }}) => any;
{% endfor %}
} // namespace functions{% endif %}<|end|>{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' %}<|start|>user<|message|>{{ message.content }}<|end|>
{%- elif message.role == 'assistant' and message.tool_calls %}{% set call = message.tool_calls[0].function -%}
<|start|>assistant<|channel|>commentary to=functions.{{ call.name }} <|constrain|>json<|message|>
{{- call.arguments | tojson }}<|call|>
{%- elif message.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>{{ message.content }}<|end|>
{%- elif message.role == 'tool' %}<|start|>functions.{{ message.name }} to=assistant<|channel|>commentary<|message|>
{{- message.content | tojson }}<|end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}
"""
