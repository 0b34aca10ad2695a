/*
 * model.c: the table of ddp-train's models (model.h), the one place a new model is named. The
 * first row is the default of --model.
 */
#include <string.h>

#include "model.h"

/* The rows, each defined in its own file model_NAME.c. */
extern const model_ops model_mlp;
extern const model_ops model_gpt;

static const model_ops *const model_table[] = {
    &model_mlp,
    &model_gpt,
};

#define NMODELS (sizeof model_table / sizeof model_table[0])

const model_ops *model_find(const char *name)
{
    for (size_t i = 0; i < NMODELS; i++)
        if (!strcmp(model_table[i]->name, name))
            return model_table[i];
    return NULL;
}

const char *const *model_names(void)
{
    static const char *names[NMODELS + 1];
    for (size_t i = 0; i < NMODELS; i++)
        names[i] = model_table[i]->name;
    return names;
}

const model_ops *model_at(size_t i)
{
    return i < NMODELS ? model_table[i] : NULL;
}

size_t model_count(void)
{
    return NMODELS;
}
