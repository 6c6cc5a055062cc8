/* Macros cppcheck must know to parse gkm (it does not read system headers). */
#define cJSON_ArrayForEach(element, array)                                                         \
	for (element = (array) != NULL ? (array)->child : NULL; element != NULL;                   \
	     element = element->next)
