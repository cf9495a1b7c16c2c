# take_guide_block(LANG TEXT_VAR BLOCK_VAR): takes the first ```LANG block out of the Markdown
# text in the variable TEXT_VAR: its lines go into BLOCK_VAR, and TEXT_VAR keeps what follows the
# block. Callers loop while the text still MATCHES "```LANG\n". A macro, not a function: the
# text, C++ and messages alike, stays one string (never a CMake list, which ';' and '[' split).
macro(take_guide_block lang text_var block_var)
  string(FIND "${${text_var}}" "```${lang}\n" _guide_begin)
  string(LENGTH "```${lang}\n" _guide_marker)
  math(EXPR _guide_begin "${_guide_begin} + ${_guide_marker}")
  string(SUBSTRING "${${text_var}}" ${_guide_begin} -1 ${text_var})
  string(FIND "${${text_var}}" "```" _guide_end)
  string(SUBSTRING "${${text_var}}" 0 ${_guide_end} ${block_var})
  math(EXPR _guide_end "${_guide_end} + 3")
  string(SUBSTRING "${${text_var}}" ${_guide_end} -1 ${text_var})
endmacro()
