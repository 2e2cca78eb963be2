# Renders one man page from its Markdown source with lowdown (docs/man/CMakeLists.txt):
#   cmake -DLOWDOWN=... -DIN=page.N.md -DOUT=page.N -DTITLE=page -DSECTION=N
#         -DSOURCE="idemd X.Y.Z" -DVOLUME="..." -P render.cmake
# lowdown 1.0 writes each term of a definition list as a paragraph pulled up by one line
# (.sp -1v) before an indented one, which nroff cannot do (only below a heading): every
# term but the first of a list would stand on a line of its own. Such a term becomes the
# tag of a .TP paragraph instead, the man macro made for it.
execute_process(COMMAND ${LOWDOWN} -s -Tman --out-no-smarty -M "title=${TITLE}"
                        -M "section=${SECTION}" -M "source=${SOURCE}" -M "volume=${VOLUME}" ${IN}
                OUTPUT_VARIABLE roff RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "lowdown failed on ${IN} (${rc})")
endif()
string(REGEX REPLACE
       "\\.LP\n([^\n]*)\n\\.if n \\\\\n\\.sp -1v\n\\.if t \\\\\n\\.sp -0\\.25v\n\\.IP \"\" 5n\n"
       ".TP 5n\n\\1\n" roff "${roff}")
file(WRITE ${OUT} "${roff}")
