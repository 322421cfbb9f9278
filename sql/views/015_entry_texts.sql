-- entry_texts: each source entry's text exactly as `om recall` prints it (om_core/pi/source_text.py:
-- text blocks verbatim, thinking and tool calls marked, a tool result under its tool's name, a shell
-- run as `$ command` and its output, images as a placeholder). tests/test_catalog.py checks it
-- against recall's own rendering, entry by entry.

CREATE OR REPLACE VIEW entry_texts AS
WITH messages AS (  -- the message Pi builds from each source entry (session.entry_as_message)
    SELECT session_id, entry_id, line_no, entry_type, role, ts,
           CASE entry_type
               WHEN 'message' THEN json_extract(raw, '$.message')
               WHEN 'custom_message' THEN json_object('role', 'custom', 'content', json_extract(raw, '$.content'))
               WHEN 'branch_summary' THEN json_object('role', 'branchSummary', 'summary',
                                                      json_extract(raw, '$.summary'))
           END AS m
    FROM entries
    WHERE is_source
), pieces AS (
    SELECT *,
           json_extract_string(m, '$.role') AS r,
           CASE WHEN json_type(m, '$.content') = 'ARRAY' THEN json_extract(m, '$.content[*]') ELSE [] END AS blocks,
           -- text blocks verbatim and images as a placeholder; a plain string content as it is
           CASE json_type(m, '$.content')
               WHEN 'VARCHAR' THEN json_extract_string(m, '$.content')
               WHEN 'ARRAY' THEN array_to_string(list_filter(list_transform(json_extract(m, '$.content[*]'), lambda b:
                   CASE WHEN json_type(b) <> 'OBJECT' THEN NULL
                        WHEN json_extract_string(b, '$.type') = 'text' AND json_type(b, '$.text') = 'VARCHAR'
                            THEN json_extract_string(b, '$.text')
                        WHEN json_extract_string(b, '$.type') = 'image'
                            THEN '[image: ' || coalesce(json_extract_string(b, '$.mimeType'), 'unknown type') || ']'
                   END), lambda x: x IS NOT NULL), chr(10))
               ELSE ''
           END AS blocks_text
    FROM messages
    WHERE json_type(m) = 'OBJECT'
), assistant AS (  -- an assistant's thinking, text and tool calls, one piece each
    SELECT session_id, entry_id,
           array_to_string(list_filter(list_transform(blocks, lambda b:
               CASE WHEN json_type(b) <> 'OBJECT' THEN NULL
                    WHEN json_extract_string(b, '$.type') = 'thinking' AND json_type(b, '$.thinking') = 'VARCHAR'
                         AND json_extract_string(b, '$.thinking') <> ''
                        THEN '(thinking) ' || json_extract_string(b, '$.thinking')
                    WHEN json_extract_string(b, '$.type') = 'text' AND json_type(b, '$.text') = 'VARCHAR'
                        THEN json_extract_string(b, '$.text')
                    WHEN json_extract_string(b, '$.type') = 'toolCall'
                        THEN '(tool call ' || coalesce(json_extract_string(b, '$.id'), '') || ') '
                             || coalesce(json_extract_string(b, '$.name'), '?') || '('
                             || coalesce(json_extract(b, '$.arguments')::VARCHAR, 'null') || ')'
               END), lambda x: x IS NOT NULL), chr(10)) AS said
    FROM pieces
    WHERE r = 'assistant'
)
SELECT p.session_id, p.entry_id, p.line_no, p.entry_type, p.role, p.ts,
       CASE p.r
           WHEN 'assistant' THEN
               CASE WHEN a.said = '' AND coalesce(json_extract_string(p.m, '$.errorMessage'), '') <> ''
                   THEN '(no reply: ' || coalesce(json_extract_string(p.m, '$.stopReason'), 'error') || ': '
                        || json_extract_string(p.m, '$.errorMessage') || ')'
                   ELSE a.said END
           WHEN 'toolResult' THEN
               '(' || coalesce(json_extract_string(p.m, '$.toolName'), 'tool')
               || CASE WHEN json_extract(p.m, '$.isError')::VARCHAR = 'true' THEN ' error' ELSE '' END || ') '
               || p.blocks_text
           WHEN 'bashExecution' THEN
               '$ ' || coalesce(json_extract_string(p.m, '$.command'), '') || chr(10)
               || coalesce(json_extract_string(p.m, '$.output'), '')
               || CASE WHEN json_extract(p.m, '$.cancelled')::VARCHAR = 'true' THEN chr(10) || '(command cancelled)'
                       WHEN coalesce(json_extract(p.m, '$.exitCode')::VARCHAR, 'null') NOT IN ('null', '0')
                           THEN chr(10) || '(exit code ' || json_extract_string(p.m, '$.exitCode') || ')'
                       ELSE '' END
           WHEN 'branchSummary' THEN coalesce(CASE WHEN json_type(p.m, '$.summary') = 'VARCHAR'
                                                   THEN json_extract_string(p.m, '$.summary') END, '')
           WHEN 'compactionSummary' THEN coalesce(CASE WHEN json_type(p.m, '$.summary') = 'VARCHAR'
                                                       THEN json_extract_string(p.m, '$.summary') END, '')
           ELSE p.blocks_text
       END AS text
FROM pieces p LEFT JOIN assistant a USING (session_id, entry_id);
