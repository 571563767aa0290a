/* log.h - messages on stderr. Never allocates; safe against recursion. */
#ifndef CUDEFER_LOG_H
#define CUDEFER_LOG_H

enum cd_log_level { CD_LOG_OFF, CD_LOG_ERROR, CD_LOG_INFO, CD_LOG_DEBUG };

int cd_log_level(void);

/* "cudefer: " + message + newline when level <= CUDEFER_LOG. */
void cd_log(enum cd_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The message as given, whatever the level (used before the level is known). */
void cd_log_raw(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
